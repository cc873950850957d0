//! Builds the CPU simulator of the CUDA kernels (sim/, docs/gpu.md §3): every
//! `extern "C" __global__` kernel in kernels/*.cu is compiled for the host with sim/sim.h and
//! registered by name, so the tests launch the very sources NVRTC compiles on a GPU.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = manifest.join("kernels");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("crates/gpu/kernels is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu" || x == "cuh"))
        .collect();
    files.sort();
    let mut includes = String::new();
    let mut registry = String::new();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        if f.extension().is_some_and(|x| x == "cu") {
            includes.push_str(&format!("#include \"{}\"\n", f.display()));
            let text = std::fs::read_to_string(f).expect("kernel source is UTF-8");
            for name in kernel_names(&text) {
                registry.push_str(&format!("FNSIM_KERNEL({name})\n"));
            }
        }
    }
    println!("cargo:rerun-if-changed={}", kernels.display());
    write_if_changed(&out.join("sim_kernels.inc"), &includes);
    // The sources NVRTC compiles, common.cuh first, embedded in the binary.
    let mut sources = String::from(
        "/// Every kernel source file (name, text), common.cuh first.\npub const SOURCES: &[(&str, &str)] = &[\n",
    );
    let mut ordered: Vec<&PathBuf> = files.iter().filter(|f| f.extension().is_some_and(|x| x == "cuh")).collect();
    ordered.extend(files.iter().filter(|f| f.extension().is_some_and(|x| x == "cu")));
    for f in ordered {
        let name = f.file_name().expect("a file name").to_string_lossy();
        sources.push_str(&format!("    ({name:?}, include_str!({:?})),\n", f.display().to_string()));
    }
    sources.push_str("];\n");
    write_if_changed(&out.join("kernel_sources.rs"), &sources);
    write_if_changed(&out.join("sim_registry.inc"), &registry);
    let sim = manifest.join("sim");
    println!("cargo:rerun-if-changed={}", sim.join("sim.cpp").display());
    println!("cargo:rerun-if-changed={}", sim.join("sim.h").display());
    cc::Build::new()
        .cpp(true)
        .file(sim.join("sim.cpp"))
        .include(&sim)
        .include(&kernels)
        .include(&out)
        .flag_if_supported("-std=c++17")
        .flag_if_supported("-fno-strict-aliasing")
        // _longjmp between fiber stacks: glibc's fortified longjmp would take that for a bug.
        .flag_if_supported("-U_FORTIFY_SOURCE")
        // Kernels compiled for the host trip warnings that mean nothing there (unused
        // parameters of the device-only paths); the nvcc check sees them as CUDA.
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unused-function")
        .flag_if_supported("-Wno-unused-variable")
        .opt_level(2)
        .compile("fnsim");
}

/// The names of the `extern "C" __global__ void NAME(` kernels in a source.
fn kernel_names(text: &str) -> Vec<String> {
    let key = "extern \"C\" __global__ void ";
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(key) {
        rest = &rest[i + key.len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    names
}

fn write_if_changed(path: &Path, text: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).expect("OUT_DIR is writable");
    }
}
