//! `--device` as a user passes it: a model on the CUDA-kernel simulator gives the CPU's
//! greedy text and logits; a machine without CUDA says what is missing; a bad name is refused.

use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_frognano"));
    c.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    c.env_remove("FROGNANO_DEVICE");
    c
}

fn logits(device: &str) -> Vec<Vec<f64>> {
    let out =
        bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5,17,300,2", "--device", device]).output().unwrap();
    assert!(out.status.success(), "--device {device}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect()
}

#[test]
fn the_simulated_gpu_gives_the_cpus_logits_and_greedy_text() {
    let (cpu, sim) = (logits("cpu"), logits("sim"));
    assert_eq!(cpu.len(), sim.len());
    let d = cpu.iter().flatten().zip(sim.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(d < 1e-3, "logits on the simulated GPU differ from the CPU's by {d}");
    let run = |device: &str| {
        let out = bin()
            .args([
                "run",
                "fixtures/qwen35-tiny",
                "-p",
                "Hello there",
                "--temperature",
                "0",
                "-n",
                "6",
                "--device",
                device,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "--device {device}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(run("sim"), run("cpu"), "greedy text on the simulated GPU");
    // --stats names the device the model ran on.
    let out = bin()
        .args([
            "run",
            "fixtures/qwen35-tiny",
            "-p",
            "Hi",
            "--temperature",
            "0",
            "-n",
            "2",
            "--device",
            "sim",
            "--stats",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sim (CPU simulator"), "{err}");
}

#[test]
fn cuda_without_a_driver_is_an_error_naming_what_is_missing() {
    // This machine (and CI's) has no NVIDIA driver; with one, the run simply works.
    let out = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5", "--device", "cuda"]).output().unwrap();
    if out.status.success() {
        return;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--device cuda:0") && err.contains("libcuda"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5", "--device", "tpu"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown device") && err.contains("cuda:N"), "{err}");
    let out =
        bin().args(["logits", "fixtures/qwen35-tiny", "--ids", "5"]).env("FROGNANO_DEVICE", "gpu9").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("FROGNANO_DEVICE"), "the variable is named");
}
