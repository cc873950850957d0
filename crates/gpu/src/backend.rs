//! What the model needs from a device, in one trait: memory, copies, kernel launches by name
//! and one GEMM. Two implementations: [`crate::cuda::CudaDevice`] (an NVIDIA GPU through
//! cudarc, opened at run time) and [`crate::sim::SimDevice`] (the kernels compiled for the
//! host and run on the CPU simulator, for tests). Everything above this trait — the kernel
//! wrappers, the model forwards, the caches — is the same code on both.

use std::sync::Arc;

/// What a device operation fails with.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No usable device: the driver or a library is missing, or the ordinal does not exist.
    #[error("{0}")]
    Unavailable(String),
    /// A kernel failed to compile (NVRTC's log attached).
    #[error("kernel compilation failed: {0}")]
    Compile(String),
    /// A CUDA call failed.
    #[error("{op}: {msg}")]
    Cuda {
        /// The operation (`cuMemAlloc`, `launch rms_norm`, …).
        op: String,
        /// The driver's or library's message.
        msg: String,
    },
    /// The model or its input cannot run on the device (names the reason).
    #[error("{0}")]
    Unsupported(String),
}

/// Results of device operations.
pub type Result<T> = std::result::Result<T, GpuError>;

/// One kernel argument, as `cuLaunchKernel` takes it: a device address or a 32-bit scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A device address (`T*`).
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `unsigned`.
    U32(u32),
    /// `float`.
    F32(f32),
}

/// One 8-byte slot per argument, each holding its value as the kernel's parameter reads it:
/// what `cuLaunchKernel` (and the simulator) take pointers to.
pub(crate) fn arg_slots(args: &[Arg]) -> Vec<[u8; 8]> {
    args.iter()
        .map(|a| {
            let mut v = [0u8; 8];
            match *a {
                Arg::Ptr(p) => v.copy_from_slice(&p.to_ne_bytes()),
                Arg::I32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                Arg::U32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                Arg::F32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
            }
            v
        })
        .collect()
}

/// Element types a GEMM operand can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmType {
    /// f32.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

impl GemmType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            GemmType::F32 => 4,
            GemmType::F16 | GemmType::BF16 => 2,
        }
    }
}

/// `y[n, rows] = x[n, cols] · w[rows, cols]ᵀ` (all row-major; `w` and `x` of the same type,
/// `y` f32), the one GEMM the model runs (cuBLAS on a GPU).
#[derive(Debug, Clone, Copy)]
pub struct MatmulNt {
    /// `[rows, cols]`.
    pub w: u64,
    /// `[n, cols]`.
    pub x: u64,
    /// Element type of `w` and `x`.
    pub ty: GemmType,
    /// `[n, rows]`, f32, overwritten.
    pub y: u64,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Input rows.
    pub n: usize,
}

/// A device: memory, copies, kernels by name, the GEMM. Calls are ordered (one stream);
/// [`Device::download`] waits for what came before it.
pub trait Device: Send + Sync {
    /// What the device is, for logs and `--stats` (`NVIDIA H200 (sm_90, 139.8 GiB)`).
    fn describe(&self) -> String;
    /// A zeroed allocation of `bytes` (at least 1).
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// Frees an allocation from [`Device::alloc`].
    fn free(&self, ptr: u64);
    /// Copies host bytes to `dst`.
    fn upload(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// Copies `dst.len()` bytes from `src` to the host, after every earlier operation.
    fn download(&self, src: u64, dst: &mut [u8]) -> Result<()>;
    /// Copies `bytes` from `src` to `dst` on the device.
    fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// Launches kernel `name` (an `extern "C" __global__` function of kernels/) on `grid`
    /// blocks of `block` threads with `shared` bytes of dynamic shared memory.
    fn launch(&self, name: &str, grid: [u32; 3], block: [u32; 3], shared: u32, args: &[Arg]) -> Result<()>;
    /// Runs one [`MatmulNt`].
    fn matmul_nt(&self, m: &MatmulNt) -> Result<()>;
    /// Waits until everything issued so far has finished.
    fn sync(&self) -> Result<()>;
    /// Bytes of device memory free now and in all, when the device knows.
    fn memory(&self) -> Option<(usize, usize)> {
        None
    }
}

/// A shared device.
pub type Gpu = Arc<dyn Device>;

/// Device memory that frees itself.
pub struct Buffer {
    ptr: u64,
    bytes: usize,
    dev: Gpu,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({} bytes at {:#x})", self.bytes, self.ptr)
    }
}

impl Buffer {
    /// `bytes` zeroed bytes on `dev`.
    pub fn zeroed(dev: &Gpu, bytes: usize) -> Result<Buffer> {
        let ptr = dev.alloc(bytes.max(1))?;
        Ok(Buffer { ptr, bytes, dev: dev.clone() })
    }
    /// A device copy of `data`.
    pub fn from_bytes(dev: &Gpu, data: &[u8]) -> Result<Buffer> {
        let b = Buffer::zeroed(dev, data.len())?;
        dev.upload(b.ptr, data)?;
        Ok(b)
    }
    /// A device copy of `data`.
    pub fn from_f32(dev: &Gpu, data: &[f32]) -> Result<Buffer> {
        Buffer::from_bytes(dev, bytemuck_f32(data))
    }
    /// A device copy of `data`.
    pub fn from_i32(dev: &Gpu, data: &[i32]) -> Result<Buffer> {
        // SAFETY: i32 has no padding; any byte view of it is valid.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        Buffer::from_bytes(dev, bytes)
    }
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// The address `offset` bytes in.
    pub fn at(&self, offset: usize) -> u64 {
        debug_assert!(offset <= self.bytes);
        self.ptr + offset as u64
    }
    /// As a kernel argument.
    pub fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// The device this buffer lives on.
    pub fn device(&self) -> &Gpu {
        &self.dev
    }
    /// The whole buffer as f32 values on the host.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut v = vec![0.0f32; self.bytes / 4];
        // SAFETY: f32 has no padding and every bit pattern is valid.
        let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 4) };
        self.dev.download(self.ptr, bytes)?;
        Ok(v)
    }
    /// The whole buffer as bytes on the host.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = vec![0u8; self.bytes];
        self.dev.download(self.ptr, &mut v)?;
        Ok(v)
    }
    /// Overwrites the start of the buffer with `data`.
    pub fn write_f32(&self, data: &[f32]) -> Result<()> {
        assert!(data.len() * 4 <= self.bytes, "write past the end of a device buffer");
        self.dev.upload(self.ptr, bytemuck_f32(data))
    }
    /// A device copy of this buffer.
    pub fn duplicate(&self) -> Result<Buffer> {
        let b = Buffer::zeroed(&self.dev, self.bytes)?;
        self.dev.copy(b.ptr, self.ptr, self.bytes)?;
        Ok(b)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.dev.free(self.ptr);
    }
}

/// The bytes of an f32 slice.
pub fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte of it is initialised.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}
