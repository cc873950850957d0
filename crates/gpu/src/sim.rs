//! [`SimDevice`]: the kernels of kernels/ compiled for the host (build.rs) and run on the CPU
//! simulator of sim/ — every CUDA thread a fiber, barriers and warp shuffles as on the device
//! (docs/gpu.md §3). Device memory is host memory. It is slow (a fiber switch per barrier) and
//! exists so that the tests check every kernel and the whole GPU forward on a machine without
//! a GPU; `--device sim` runs a model on it.

use std::alloc::Layout;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::Mutex;

use crate::backend::{Arg, Device, GemmType, GpuError, MatmulNt, Result};

extern "C" {
    fn fnsim_launch(
        name: *const c_char,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        args: *mut *mut c_void,
    ) -> c_int;
    fn fnsim_kernel_names() -> *const c_char;
}

/// The simulator keeps its scheduler in globals: one launch at a time in the process.
static LAUNCH: Mutex<()> = Mutex::new(());

/// Device memory is aligned as cudaMalloc's is.
const ALIGN: usize = 256;

/// The CPU simulator as a [`Device`].
#[derive(Default)]
pub struct SimDevice {
    allocations: Mutex<HashMap<u64, usize>>,
}

impl SimDevice {
    /// A simulator.
    pub fn new() -> SimDevice {
        SimDevice::default()
    }

    /// Every kernel the simulator has, by name.
    pub fn kernel_names() -> Vec<String> {
        // SAFETY: the simulator returns a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(fnsim_kernel_names()) };
        s.to_string_lossy().lines().map(str::to_string).collect()
    }

    /// Bytes allocated now.
    pub fn allocated(&self) -> usize {
        self.allocations.lock().expect("allocation table").values().sum()
    }

    fn check(&self, ptr: u64, bytes: usize, op: &str) -> Result<()> {
        let table = self.allocations.lock().expect("allocation table");
        let inside = table.iter().any(|(&base, &len)| ptr >= base && ptr + bytes as u64 <= base + len as u64);
        match inside || bytes == 0 {
            true => Ok(()),
            false => Err(GpuError::Cuda {
                op: op.into(),
                msg: format!("{bytes} bytes at {ptr:#x} are outside every allocation"),
            }),
        }
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let table = std::mem::take(&mut *self.allocations.lock().expect("allocation table"));
        for (ptr, len) in table {
            // SAFETY: allocated by `alloc` with this layout and not yet freed.
            unsafe { std::alloc::dealloc(ptr as *mut u8, Layout::from_size_align(len, ALIGN).expect("layout")) };
        }
    }
}

impl Device for SimDevice {
    fn describe(&self) -> String {
        "CPU simulator of the CUDA kernels (sim)".into()
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let layout = Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|e| GpuError::Cuda { op: "alloc".into(), msg: e.to_string() })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(GpuError::Cuda { op: "alloc".into(), msg: format!("out of memory for {bytes} bytes") });
        }
        self.allocations.lock().expect("allocation table").insert(p as u64, layout.size());
        Ok(p as u64)
    }

    fn free(&self, ptr: u64) {
        if let Some(len) = self.allocations.lock().expect("allocation table").remove(&ptr) {
            // SAFETY: allocated by `alloc` with this layout.
            unsafe { std::alloc::dealloc(ptr as *mut u8, Layout::from_size_align(len, ALIGN).expect("layout")) };
        }
    }

    fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.check(dst, src.len(), "upload")?;
        // SAFETY: checked to lie inside a live allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.check(src, dst.len(), "download")?;
        // SAFETY: checked to lie inside a live allocation.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.check(dst, bytes, "copy")?;
        self.check(src, bytes, "copy")?;
        // SAFETY: both ranges lie inside live allocations; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    fn launch(&self, name: &str, grid: [u32; 3], block: [u32; 3], shared: u32, args: &[Arg]) -> Result<()> {
        let mut values = crate::backend::arg_slots(args);
        let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| v.as_mut_ptr().cast::<c_void>()).collect();
        let cname = CString::new(name).map_err(|_| GpuError::Unsupported(format!("kernel name {name:?}")))?;
        let _one = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the simulator reads `args.len()` argument slots of the kernel's own types;
        // the wrappers in kernels.rs pass exactly the kernel's parameters.
        let rc = unsafe {
            fnsim_launch(
                cname.as_ptr(),
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared,
                ptrs.as_mut_ptr(),
            )
        };
        match rc {
            0 => Ok(()),
            1 => Err(GpuError::Cuda { op: format!("launch {name}"), msg: "no such kernel in kernels/".into() }),
            2 => Err(GpuError::Cuda {
                op: format!("launch {name}"),
                msg: "deadlock: threads of one warp or block wait at different barriers".into(),
            }),
            _ => Err(GpuError::Cuda { op: format!("launch {name}"), msg: format!("bad block shape {block:?}") }),
        }
    }

    fn matmul_nt(&self, m: &MatmulNt) -> Result<()> {
        let sz = m.ty.size();
        self.check(m.w, m.rows * m.cols * sz, "matmul w")?;
        self.check(m.x, m.n * m.cols * sz, "matmul x")?;
        self.check(m.y, m.n * m.rows * 4, "matmul y")?;
        let read = |base: u64, i: usize| -> f32 {
            // SAFETY: every index below is inside the ranges checked above.
            unsafe {
                match m.ty {
                    GemmType::F32 => *(base as *const f32).add(i),
                    GemmType::F16 => half::f16::from_bits(*(base as *const u16).add(i)).to_f32(),
                    GemmType::BF16 => half::bf16::from_bits(*(base as *const u16).add(i)).to_f32(),
                }
            }
        };
        for j in 0..m.n {
            for r in 0..m.rows {
                let mut s = 0.0f32;
                for c in 0..m.cols {
                    s += read(m.w, r * m.cols + c) * read(m.x, j * m.cols + c);
                }
                // SAFETY: inside the checked output range.
                unsafe { *(m.y as *mut f32).add(j * m.rows + r) = s };
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }
}
