//! # frognano-gpu
//!
//! FrogNano on an NVIDIA GPU (docs/gpu.md). The kernels are CUDA C++ files in `kernels/`,
//! compiled at run time by NVRTC for the device found; the driver, cuBLAS and NVRTC are opened
//! at run time too (cudarc's dynamic loading), so this crate builds on machines without CUDA
//! and the same binary runs on a GPU machine.
//!
//! Layers, from the bottom: [`backend::Device`] (memory, copies, kernels by name, one GEMM),
//! implemented by [`cuda::CudaDevice`] and by [`sim::SimDevice`] — the same kernel sources
//! compiled for the host and run on a CPU simulator, so the tests check every kernel and the
//! whole forward without a GPU; [`kernels`] (one Rust function per kernel).

pub mod attention;
pub mod backend;
pub mod cuda;
pub mod deltanet;
pub mod kernels;
pub mod quant;
pub mod sim;

use std::sync::Arc;

pub use backend::{Arg, Buffer, Device, GemmType, Gpu, GpuError, MatmulNt, Result};

/// Where a model runs (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The CPU path of frognano-model (the default).
    #[default]
    Cpu,
    /// CUDA device N (`cuda`, `cuda:N`).
    Cuda(usize),
    /// The CPU simulator of the CUDA kernels (`sim`): slow; for checking the GPU path.
    Sim,
}

impl DeviceSpec {
    /// The names `--device` takes.
    pub const NAMES: &'static str = "cpu, cuda, cuda:N, sim";
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            "sim" => Ok(DeviceSpec::Sim),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n.parse().map(DeviceSpec::Cuda).map_err(|_| {
                    format!("--device {s:?}: the ordinal after cuda: must be a number (cuda:0, cuda:1, …)")
                }),
                None => Err(format!("unknown device {s:?}: expected one of {}", DeviceSpec::NAMES)),
            },
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::Sim => f.write_str("sim"),
        }
    }
}

/// Opens the device `spec` names (not [`DeviceSpec::Cpu`], which has none).
pub fn open(spec: DeviceSpec) -> Result<Gpu> {
    match spec {
        DeviceSpec::Cpu => Err(GpuError::Unsupported("the CPU is not a GPU device".into())),
        DeviceSpec::Cuda(n) => Ok(Arc::new(cuda::CudaDevice::open(n)?)),
        DeviceSpec::Sim => Ok(Arc::new(sim::SimDevice::new())),
    }
}

pub mod model;

pub use model::GpuModel;

/// Places every model frognano-model loads on one device (`--device`): the
/// [`frognano_model::load::Accelerator`] of this crate.
pub struct GpuAccelerator {
    spec: DeviceSpec,
    dev: Gpu,
}

impl GpuAccelerator {
    /// Opens `spec`'s device now, so that a missing driver is reported before any loading.
    pub fn open(spec: DeviceSpec) -> Result<GpuAccelerator> {
        Ok(GpuAccelerator { spec, dev: open(spec)? })
    }

    /// The device.
    pub fn device(&self) -> &Gpu {
        &self.dev
    }
}

impl frognano_model::load::Accelerator for GpuAccelerator {
    fn name(&self) -> String {
        format!("{} ({})", self.spec, self.dev.describe())
    }

    fn place_model(
        &self,
        m: &dyn frognano_model::CausalLm,
    ) -> frognano_model::Result<(Box<dyn frognano_model::CausalLm>, usize)> {
        let on_device =
            GpuModel::from_cpu(&self.dev, m).map_err(|e| frognano_model::ModelError::Device(e.to_string()))?;
        let bytes = on_device.weight_bytes();
        Ok((Box::new(on_device), bytes))
    }
}

/// Makes every later `frognano_model::load` place its model on `spec` (the CPU: as loaded).
/// The device is opened here, so a machine without one fails now, naming what is missing.
pub fn install(spec: DeviceSpec) -> Result<()> {
    match spec {
        DeviceSpec::Cpu => frognano_model::load::set_accelerator(None),
        _ => frognano_model::load::set_accelerator(Some(Arc::new(GpuAccelerator::open(spec)?))),
    }
    Ok(())
}

/// The device this crate's tests run on: `FROGNANO_TEST_DEVICE` (`cuda`, `cuda:N`, `sim`),
/// else `cuda` when `FROGNANO_REQUIRE_GPU` is set (bench/gpu.sh), else the simulator — so a
/// machine without a GPU runs every test on the simulator, and a GPU run that cannot open its
/// device fails instead of quietly testing the simulator.
///
/// # Panics
/// When the device named cannot be opened (the message says why).
pub fn test_device() -> Gpu {
    let spec = match std::env::var("FROGNANO_TEST_DEVICE") {
        Ok(s) => s.parse().unwrap_or_else(|e| panic!("FROGNANO_TEST_DEVICE: {e}")),
        Err(_) if std::env::var_os("FROGNANO_REQUIRE_GPU").is_some() => DeviceSpec::Cuda(0),
        Err(_) => DeviceSpec::Sim,
    };
    open(spec).unwrap_or_else(|e| panic!("cannot open {spec} for the tests: {e}"))
}

/// The repository's `fixtures/` folder: `FROGNANO_FIXTURES` when set (test binaries carried to
/// another machine), else the one beside this crate.
pub fn fixtures_dir() -> std::path::PathBuf {
    match std::env::var_os("FROGNANO_FIXTURES") {
        Some(p) => p.into(),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"),
    }
}
