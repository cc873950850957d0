//! [`CudaDevice`]: an NVIDIA GPU through cudarc with dynamic loading (docs/gpu.md §1). Nothing
//! CUDA is needed to build: `libcuda`, `libcublas` and `libnvrtc` are looked for when a GPU is
//! asked for, and a missing one is an error that names it (never a panic). The kernels of
//! kernels/ are compiled by NVRTC for the device's architecture on first use and the PTX
//! cached under `$XDG_CACHE_HOME/frognano/cuda` (`~/.cache/…`), keyed by a hash of the source,
//! the architecture and the NVRTC version.
//!
//! Every operation goes on the legacy default stream, so kernels, GEMMs and the synchronous
//! copies are ordered without events.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::sync::Mutex;

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::{result as drv, sys as drv_sys};

use crate::backend::{Arg, Device, GemmType, GpuError, MatmulNt, Result};

/// One CUDA device with its context, kernel module and cuBLAS handle.
pub struct CudaDevice {
    ordinal: usize,
    ctx: drv_sys::CUcontext,
    functions: HashMap<String, drv_sys::CUfunction>,
    cublas: cublas_sys::cublasHandle_t,
    name: String,
    arch: (i32, i32),
    total: usize,
    /// cuBLAS handles are not to be used from two threads at once.
    lock: Mutex<()>,
}

// SAFETY: the context, functions and cuBLAS handle are plain handles; every use binds the
// context to the calling thread first, and `lock` serialises the calls.
unsafe impl Send for CudaDevice {}
// SAFETY: as above.
unsafe impl Sync for CudaDevice {}

fn cuda_err(op: &str, e: impl std::fmt::Debug) -> GpuError {
    GpuError::Cuda { op: op.into(), msg: format!("{e:?}") }
}

/// Fails, naming the library, unless the three libraries a GPU run needs can be opened.
pub fn check_libraries() -> Result<()> {
    // SAFETY: these only try to open the libraries.
    let (cuda, cublas, nvrtc) = unsafe {
        (drv_sys::is_culib_present(), cudarc::cublas::sys::is_culib_present(), cudarc::nvrtc::sys::is_culib_present())
    };
    let missing: Vec<&str> =
        [(cuda, "libcuda.so (the NVIDIA driver)"), (cublas, "libcublas.so.13"), (nvrtc, "libnvrtc.so.13")]
            .iter()
            .filter(|(ok, _)| !ok)
            .map(|(_, n)| *n)
            .collect();
    match missing.is_empty() {
        true => Ok(()),
        false => Err(GpuError::Unavailable(format!(
            "no CUDA here: cannot open {} (install the NVIDIA driver and the CUDA 13 libraries, or add their folder, \
             e.g. /usr/local/cuda/lib64, to LD_LIBRARY_PATH)",
            missing.join(", ")
        ))),
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal` and compiles (or loads from the cache) the kernels for it.
    pub fn open(ordinal: usize) -> Result<CudaDevice> {
        check_libraries()?;
        drv::init().map_err(|e| cuda_err("cuInit", e))?;
        let count = drv::device::get_count().map_err(|e| cuda_err("cuDeviceGetCount", e))? as usize;
        if ordinal >= count {
            return Err(GpuError::Unavailable(format!(
                "--device cuda:{ordinal}: this machine has {count} CUDA device(s) (cuda:0..cuda:{})",
                count.saturating_sub(1)
            )));
        }
        let dev = drv::device::get(ordinal as i32).map_err(|e| cuda_err("cuDeviceGet", e))?;
        // SAFETY: `dev` came from cuDeviceGet.
        let ctx = unsafe { drv::primary_ctx::retain(dev) }.map_err(|e| cuda_err("cuDevicePrimaryCtxRetain", e))?;
        // SAFETY: a retained primary context.
        unsafe { drv::ctx::set_current(ctx) }.map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        let name = drv::device::get_name(dev).unwrap_or_else(|_| "CUDA device".into());
        let attr = |a| {
            // SAFETY: `dev` came from cuDeviceGet.
            unsafe { drv::device::get_attribute(dev, a) }.map_err(|e| cuda_err("cuDeviceGetAttribute", e))
        };
        let arch = (
            attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(drv_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        // SAFETY: `dev` came from cuDeviceGet.
        let total = unsafe { drv::device::total_mem(dev) }.unwrap_or(0);
        let ptx = compiled_kernels(arch)?;
        let image = CString::new(ptx).map_err(|_| GpuError::Compile("PTX with a NUL byte".into()))?;
        // SAFETY: a NUL-terminated PTX image, the context current.
        let module = unsafe { drv::module::load_data(image.as_ptr().cast::<c_void>()) }
            .map_err(|e| cuda_err("cuModuleLoadData", e))?;
        let mut functions = HashMap::new();
        for name in crate::kernels::names() {
            let cname = CString::new(name.clone()).expect("kernel names have no NUL");
            // SAFETY: a loaded module.
            let f = unsafe { drv::module::get_function(module, cname) }
                .map_err(|e| cuda_err(&format!("cuModuleGetFunction {name}"), e))?;
            functions.insert(name, f);
        }
        let cublas = cudarc::cublas::result::create_handle().map_err(|e| cuda_err("cublasCreate", e))?;
        Ok(CudaDevice { ordinal, ctx, functions, cublas, name, arch, total, lock: Mutex::new(()) })
    }

    fn bind(&self) -> Result<std::sync::MutexGuard<'_, ()>> {
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: our retained context.
        unsafe { drv::ctx::set_current(self.ctx) }.map_err(|e| cuda_err("cuCtxSetCurrent", e))?;
        Ok(g)
    }
}

/// Whether libnvrtc can be opened (it compiles kernels without a GPU or a driver).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles every kernel with NVRTC for compute capability `arch` (`(9, 0)`: sm_90) with the
/// options a GPU run uses, and returns the PTX. Needs only libnvrtc, no GPU: the tests compile
/// the kernels with it exactly as `--device cuda` will.
pub fn compile_kernels(arch: (i32, i32)) -> Result<String> {
    if !nvrtc_present() {
        return Err(GpuError::Unavailable("cannot open libnvrtc.so.13 (CUDA 13's runtime compiler)".into()));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=sm_{}{}", arch.0, arch.1), "-std=c++17".into(), "--fmad=true".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(crate::kernels::source(), opts)
        .map_err(|e| GpuError::Compile(compile_error_text(e)))?;
    Ok(ptx.to_src())
}

/// NVRTC's log when it has one (the lines naming file, line and problem).
fn compile_error_text(e: cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    }
}

/// The PTX of every kernel for compute capability `arch`, from the cache or NVRTC.
fn compiled_kernels(arch: (i32, i32)) -> Result<String> {
    let src = crate::kernels::source();
    let arch_flag = format!("--gpu-architecture=sm_{}{}", arch.0, arch.1);
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters; libnvrtc was found by `check_libraries`.
    let _ = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    let nvrtc_version = format!("{major}.{minor}");
    let key = fnv1a(format!("{src}\n{arch_flag}\n{nvrtc_version}").as_bytes());
    let cache = cache_dir().map(|d| d.join(format!("kernels-{key:016x}.ptx")));
    if let Some(text) = cache.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(text);
    }
    let text = compile_kernels(arch)?;
    if let Some(p) = cache {
        // A cache that cannot be written only costs the next start a compile.
        let _ = std::fs::create_dir_all(p.parent().expect("cache file has a folder"));
        let _ = std::fs::write(&p, &text);
    }
    Ok(text)
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("frognano").join("cuda"))
}

/// FNV-1a, 64-bit: a stable hash for the cache key.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Ok(_g) = self.bind() {
            // SAFETY: our handle, not used after this.
            let _ = unsafe { cudarc::cublas::result::destroy_handle(self.cublas) };
        }
    }
}

impl Device for CudaDevice {
    fn describe(&self) -> String {
        format!(
            "{} (cuda:{}, sm_{}{}, {:.1} GiB)",
            self.name,
            self.ordinal,
            self.arch.0,
            self.arch.1,
            self.total as f64 / (1u64 << 30) as f64
        )
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let _g = self.bind()?;
        // SAFETY: the context is current.
        let p = unsafe { drv::malloc_sync(bytes.max(1)) }.map_err(|e| {
            let free = self.memory_locked().map(|(f, _)| format!(" ({} MiB free)", f >> 20)).unwrap_or_default();
            cuda_err(&format!("cuMemAlloc of {} MiB{free}", bytes >> 20), e)
        })?;
        // SAFETY: just allocated, `bytes` long.
        unsafe { drv::memset_d8_sync(p, 0, bytes.max(1)) }.map_err(|e| cuda_err("cuMemsetD8", e))?;
        Ok(p)
    }

    fn free(&self, ptr: u64) {
        if let Ok(_g) = self.bind() {
            // SAFETY: allocated by `alloc`, freed once (Buffer's drop).
            let _ = unsafe { drv::free_sync(ptr) };
        }
    }

    fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: `dst` is a device allocation at least `src.len()` long (the callers' buffers).
        unsafe { drv::memcpy_htod_sync(dst, src) }.map_err(|e| cuda_err("cuMemcpyHtoD", e))
    }

    fn download(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: `src` is a device allocation at least `dst.len()` long.
        unsafe { drv::memcpy_dtoh_sync(dst, src) }.map_err(|e| cuda_err("cuMemcpyDtoH", e))
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        let _g = self.bind()?;
        // SAFETY: both are device allocations at least `bytes` long.
        unsafe { drv::memcpy_dtod_sync(dst, src, bytes) }.map_err(|e| cuda_err("cuMemcpyDtoD", e))
    }

    fn launch(&self, name: &str, grid: [u32; 3], block: [u32; 3], shared: u32, args: &[Arg]) -> Result<()> {
        let f = *self
            .functions
            .get(name)
            .ok_or_else(|| GpuError::Cuda { op: format!("launch {name}"), msg: "no such kernel in kernels/".into() })?;
        let mut values = crate::backend::arg_slots(args);
        let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| v.as_mut_ptr().cast::<c_void>()).collect();
        let _g = self.bind()?;
        // SAFETY: `params` holds one slot per kernel parameter, each at least as wide as the
        // parameter (the wrappers in kernels.rs pass the kernel's own parameter list).
        unsafe {
            drv::launch_kernel(
                f,
                (grid[0], grid[1], grid[2]),
                (block[0], block[1], block[2]),
                shared,
                std::ptr::null_mut(),
                &mut params,
            )
        }
        .map_err(|e| cuda_err(&format!("launch {name} grid {grid:?} block {block:?}"), e))?;
        if std::env::var_os("FROGNANO_CUDA_SYNC").is_some() {
            // Debugging: find the kernel that faults.
            drv::ctx::synchronize().map_err(|e| cuda_err(&format!("after {name}"), e))?;
        }
        Ok(())
    }

    fn matmul_nt(&self, m: &MatmulNt) -> Result<()> {
        // Row-major y[n, rows] = x[n, cols]·w[rows, cols]ᵀ is column-major C[rows, n] =
        // Wᵀ(rows×cols) · X(cols×n) with W read as a cols×rows column-major matrix.
        let ty = match m.ty {
            GemmType::F32 => cublas_sys::cudaDataType_t::CUDA_R_32F,
            GemmType::F16 => cublas_sys::cudaDataType_t::CUDA_R_16F,
            GemmType::BF16 => cublas_sys::cudaDataType_t::CUDA_R_16BF,
        };
        let compute = match m.ty {
            // Strict f32: the reference numerics (TF32 would lose 13 bits of mantissa).
            GemmType::F32 => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC,
            _ => cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let _g = self.bind()?;
        // SAFETY: the pointers are device buffers of the sizes the shape says (checked by the
        // wrappers that build `m`); alpha and beta are host scalars of the compute type.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                self.cublas,
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                m.rows as i32,
                m.n as i32,
                m.cols as i32,
                (&alpha as *const f32).cast(),
                m.w as *const c_void,
                ty,
                m.cols as i32,
                m.x as *const c_void,
                ty,
                m.cols as i32,
                (&beta as *const f32).cast(),
                m.y as *mut c_void,
                cublas_sys::cudaDataType_t::CUDA_R_32F,
                m.rows as i32,
                compute,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| cuda_err("cublasGemmEx", e))
    }

    fn sync(&self) -> Result<()> {
        let _g = self.bind()?;
        drv::ctx::synchronize().map_err(|e| cuda_err("cuCtxSynchronize", e))
    }

    fn memory(&self) -> Option<(usize, usize)> {
        let _g = self.bind().ok()?;
        self.memory_locked()
    }
}

impl CudaDevice {
    fn memory_locked(&self) -> Option<(usize, usize)> {
        drv::mem_get_info().ok()
    }
}
