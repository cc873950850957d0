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

/// A `frognano serve` process, killed when dropped.
struct Server(std::process::Child, u16);

impl Server {
    fn start(device: &str) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = bin()
            .args(["serve", "fixtures/qwen35-tiny", "--port", &port.to_string(), "--device", device])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < std::time::Duration::from_secs(60), "serve --device {device} did not start");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let server = Server(child, port);
        server.wait_ready();
        server
    }

    /// One HTTP/1.1 request (`Connection: close`) and the whole reply, or the I/O error.
    fn request(&self, head: &str, body: &str) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.1))?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(120)))?;
        s.write_all(
            format!("{head} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
                .as_bytes(),
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        Ok(reply)
    }

    /// Waits until `/health` answers 200 (the port opens before the model is ready).
    fn wait_ready(&self) {
        let start = std::time::Instant::now();
        loop {
            if self.request("GET /health", "").is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
                return;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(60), "serve did not become ready");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The text of a greedy `/v1/completions` reply of 6 tokens to `prompt` (a connection the
    /// loaded machine drops is tried again, twice).
    fn complete(&self, prompt: &str) -> String {
        let body = serde_json::json!({"model": "qwen35-tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0})
            .to_string();
        let mut tries = 0;
        let reply = loop {
            match self.request("POST /v1/completions", &body) {
                Ok(r) => break r,
                Err(e) if tries < 2 => {
                    tries += 1;
                    eprintln!("retrying after {e}");
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => panic!("POST /v1/completions: {e}"),
            }
        };
        let json = reply.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {reply}"));
        v["choices"][0]["text"].as_str().unwrap_or_else(|| panic!("no text: {reply}")).to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_on_the_simulated_gpu_answers_concurrent_requests_as_the_cpu_does() {
    let prompts = ["Hello there", "The quick brown fox", "def add(a, b):"];
    let cpu = Server::start("cpu");
    let want: Vec<String> = prompts.iter().map(|p| cpu.complete(p)).collect();
    drop(cpu);
    assert!(want.iter().all(|w| !w.is_empty()), "the CPU server replied: {want:?}");
    let sim = Server::start("sim");
    // At once, so the scheduler decodes them in one batch on the device.
    let got: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts.iter().map(|p| s.spawn(|| sim.complete(p))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want, "greedy replies on the simulated GPU");
}
