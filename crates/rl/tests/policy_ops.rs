//! Finite-difference gradient checks (f64) of every custom piece of the policy networks
//! (norms, RoPE, attention, conv, delta rule, log-probs), and agreement of RoPE, the conv and
//! the delta rule with frognano-model's inference kernels.

use candle_core::Var;
use candle_core::{DType, Device, Result, Tensor};
use frognano_rl::policy::ops::*;
use rand::{Rng, SeedableRng};

fn rand_tensor(shape: &[usize], scale: f64, seed: u64) -> Tensor {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// Checks d(Σ f(x)·r)/dx from autograd against central differences at every element of
/// every input (inputs are small).
fn grad_check(inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let out = f(&ts).unwrap();
    let r = rand_tensor(out.dims(), 1.0, 99);
    let loss = |ts: &[Tensor]| -> f64 { (f(ts).unwrap() * &r).unwrap().sum_all().unwrap().to_scalar().unwrap() };
    let grads = (out * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let eps = 1e-6;
    for (k, v) in vars.iter().enumerate() {
        let g: Vec<f64> = grads.get(v).expect("input reaches the output").flatten_all().unwrap().to_vec1().unwrap();
        let base: Vec<f64> = v.flatten_all().unwrap().to_vec1().unwrap();
        for i in 0..base.len() {
            let at = |delta: f64| {
                let mut b = base.clone();
                b[i] += delta;
                let mut ts = ts.clone();
                ts[k] = Tensor::from_vec(b, v.dims(), &Device::Cpu).unwrap();
                loss(&ts)
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            let tol = 1e-6 * (1.0 + fd.abs());
            assert!((fd - g[i]).abs() < tol, "input {k} element {i}: autograd {} vs finite difference {fd}", g[i]);
        }
    }
}

#[test]
fn rms_norm_and_l2_normalize_gradients() {
    grad_check(&[rand_tensor(&[3, 6], 1.0, 1), rand_tensor(&[6], 1.0, 2)], |t| rms_norm(&t[0], &(&t[1] + 1.0)?, 1e-6));
    grad_check(&[rand_tensor(&[2, 3, 5], 1.0, 3)], |t| l2_normalize(&t[0], 1e-6));
}

#[test]
fn sigmoid_softplus_gradients_and_values() {
    let x = Tensor::new(&[-30.0f64, -2.0, 0.0, 0.5, 19.0, 25.0], &Device::Cpu).unwrap();
    let sp: Vec<f64> = softplus(&x).unwrap().to_vec1().unwrap();
    for (a, b) in sp.iter().zip([-30.0f64, -2.0, 0.0, 0.5, 19.0, 25.0]) {
        let want = if b > 20.0 { b } else { b.exp().ln_1p() };
        // PyTorch switches to the identity above 20; ln(1 + e^-20) ≈ 2e-9 is below f32 resolution there.
        assert!((a - want).abs() < 1e-8, "softplus({b}) = {a}, want {want}");
    }
    grad_check(&[rand_tensor(&[7], 4.0, 4)], |t| softplus(&t[0]));
    grad_check(&[rand_tensor(&[7], 4.0, 5)], |t| sigmoid(&t[0]));
}

#[test]
fn rope_full_and_partial_gradients_and_rotation() {
    let (cos, sin) = rope_tables(4, 6, 100.0, DType::F64, &Device::Cpu).unwrap();
    grad_check(&[rand_tensor(&[2, 4, 6], 1.0, 6)], |t| rope(&t[0], &cos, &sin));
    let (cos, sin) = rope_tables(4, 4, 100.0, DType::F64, &Device::Cpu).unwrap();
    grad_check(&[rand_tensor(&[2, 4, 8], 1.0, 7)], |t| rope(&t[0], &cos, &sin));
    // Against frognano-model's rotate-half kernel.
    let x = rand_tensor(&[1, 4, 8], 1.0, 8).to_dtype(DType::F32).unwrap();
    let (cos, sin) = rope_tables(4, 4, 100.0, DType::F32, &Device::Cpu).unwrap();
    let got: Vec<f32> = rope(&x, &cos, &sin).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let mut want: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    let r = frognano_model::kernels::Rope::new(4, 100.0);
    for (p, head) in want.chunks_exact_mut(8).enumerate() {
        r.apply(head, p, frognano_model::kernels::Act::F32);
    }
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

#[test]
fn causal_attention_gqa_gradients_and_causality() {
    let q = rand_tensor(&[4, 5, 3], 1.0, 9);
    let k = rand_tensor(&[2, 5, 3], 1.0, 10);
    let v = rand_tensor(&[2, 5, 3], 1.0, 11);
    grad_check(&[q.clone(), k.clone(), v.clone()], |t| causal_attention(&t[0], &t[1], &t[2]));
    // Changing the last key/value leaves earlier outputs unchanged.
    let o1: Vec<f64> = causal_attention(&q, &k, &v).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let k2 = Tensor::cat(&[k.narrow(1, 0, 4).unwrap(), rand_tensor(&[2, 1, 3], 5.0, 12)], 1).unwrap();
    let o2: Vec<f64> = causal_attention(&q, &k2, &v).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(o1[..4 * 12], o2[..4 * 12]);
    assert_ne!(o1[4 * 12..], o2[4 * 12..]);
}

/// The whole-graph attention `softmax(q·kᵀ/√dh + mask)·v` (`[h, n, dh]`, equal head counts).
fn naive_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (h, n, dh) = q.dims3()?;
    let mask: Vec<f64> = (0..n * n).map(|i| if i % n > i / n { f64::NEG_INFINITY } else { 0.0 }).collect();
    let mask = Tensor::from_vec(mask, (n, n), &Device::Cpu)?;
    let s = (q.matmul(&k.t()?)? * (1.0 / (dh as f64).sqrt()))?.broadcast_add(&mask)?;
    softmax_last(&s)?.matmul(v)?.transpose(0, 1)?.contiguous()?.reshape((n, h * dh))
}

#[test]
fn blocked_attention_matches_the_whole_graph_over_several_blocks() {
    let n = 2 * ATTENTION_BLOCK + 37;
    let (q, k, v) =
        (rand_tensor(&[2, n, 4], 1.5, 21), rand_tensor(&[2, n, 4], 1.5, 22), rand_tensor(&[2, n, 4], 1.0, 23));
    let r = rand_tensor(&[n, 8], 1.0, 24);
    let run = |f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>| -> Vec<Vec<f64>> {
        let vars: Vec<Var> = [&q, &k, &v].iter().map(|t| Var::from_tensor(t).unwrap()).collect();
        let o = f(vars[0].as_tensor(), vars[1].as_tensor(), vars[2].as_tensor()).unwrap();
        let g = (&o * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let mut out = vec![o.flatten_all().unwrap().to_vec1().unwrap()];
        out.extend(vars.iter().map(|x| g.get(x).unwrap().flatten_all().unwrap().to_vec1().unwrap()));
        out
    };
    let (got, want) = (run(&causal_attention), run(&naive_attention));
    for (what, (a, b)) in ["output", "dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
        let d = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(d < 1e-10, "{what}: max difference {d}");
    }
}

#[test]
fn causal_conv_gradients_and_matches_inference_kernel() {
    grad_check(&[rand_tensor(&[5, 3], 1.0, 13), rand_tensor(&[3, 4], 1.0, 14)], |t| causal_conv1d(&t[0], &t[1]));
    let x = rand_tensor(&[6, 3], 1.0, 15);
    let w = rand_tensor(&[3, 4], 1.0, 16);
    let got: Vec<f64> = causal_conv1d(&x, &w).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let xf: Vec<f32> = x.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let wf: Vec<f32> = w.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let mut state = vec![0.0f32; 3 * 3];
    let want = frognano_model::kernels::conv::causal_conv1d(&xf, &mut state, &wf, 3, 4);
    for (a, b) in got.iter().zip(&want) {
        assert!((*a as f32 - b).abs() < 1e-5, "{a} vs {b}");
    }
}

fn delta_inputs(n: usize, hv: usize, dk: usize, dv: usize) -> Vec<Tensor> {
    let q = l2_normalize(&rand_tensor(&[hv, n, dk], 1.0, 17), 1e-6).unwrap();
    let k = l2_normalize(&rand_tensor(&[hv, n, dk], 1.0, 18), 1e-6).unwrap();
    let v = rand_tensor(&[hv, n, dv], 1.0, 19);
    let g = (rand_tensor(&[hv, n], 0.5, 20) - 0.6).unwrap();
    let beta = (rand_tensor(&[hv, n], 0.4, 21) + 0.5).unwrap();
    vec![q, k, v, g, beta]
}

#[test]
fn delta_rule_gradients() {
    grad_check(&delta_inputs(4, 2, 3, 2), |t| delta_rule(&t[0], &t[1], &t[2], &t[3], &t[4]));
}

#[test]
fn delta_rule_matches_inference_kernel() {
    let (n, hv, dk, dv) = (70, 2, 4, 3);
    let x = delta_inputs(n, hv, dk, dv);
    let got: Vec<f64> =
        delta_rule(&x[0], &x[1], &x[2], &x[3], &x[4]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    // The kernel wants token-major `[n, heads, d]` / `[n, heads]`.
    let tm = |t: &Tensor| -> Vec<f32> {
        let t = if t.rank() == 3 { t.transpose(0, 1).unwrap() } else { t.t().unwrap() };
        t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
    };
    let (q, k, v, g, b) = (tm(&x[0]), tm(&x[1]), tm(&x[2]), tm(&x[3]), tm(&x[4]));
    use frognano_model::kernels::delta_rule::{chunked, DeltaInputs, DeltaShape};
    let shape = DeltaShape { t: n, hk: hv, hv, dk, dv, key_head: (0..hv).collect() };
    let mut state = vec![0.0f32; hv * dk * dv];
    let want = chunked(&DeltaInputs { q: &q, k: &k, v: &v, g: &g, beta: &b }, &mut state, &shape);
    let diff = got.iter().zip(&want).map(|(a, b)| (*a as f32 - b).abs()).fold(0.0, f32::max);
    assert!(diff < 1e-4, "delta rule differs from the inference kernel by {diff}");
}

#[test]
fn gather_logprobs_gradients_and_normalisation() {
    grad_check(&[rand_tensor(&[3, 5], 3.0, 22)], |t| gather_logprobs(&t[0], &[4, 0, 2]));
    let lp: Vec<f64> = gather_logprobs(
        &rand_tensor(&[1, 5], 3.0, 23).broadcast_as((5, 5)).unwrap().contiguous().unwrap(),
        &[0, 1, 2, 3, 4],
    )
    .unwrap()
    .to_vec1()
    .unwrap();
    let total: f64 = lp.iter().map(|l| l.exp()).sum();
    assert!((total - 1.0).abs() < 1e-12, "probabilities sum to {total}");
}

#[test]
fn chunked_delta_rule_equals_recurrence_and_its_gradients_check() {
    // Several chunks with a ragged tail, chunk sizes on both sides of the block-inverse switch.
    for (n, chunk) in [(150, 64), (37, 16), (9, 4)] {
        let x = delta_inputs(n, 3, 4, 5);
        let a: Vec<f64> =
            delta_rule(&x[0], &x[1], &x[2], &x[3], &x[4]).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f64> = delta_rule_chunked(&x[0], &x[1], &x[2], &x[3], &x[4], chunk)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let d = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(d < 1e-10, "n {n}, chunk {chunk}: chunked differs from the recurrence by {d}");
    }
    grad_check(&delta_inputs(11, 2, 3, 2), |t| delta_rule_chunked(&t[0], &t[1], &t[2], &t[3], &t[4], 4));
    grad_check(&delta_inputs(20, 1, 3, 2), |t| delta_rule_chunked(&t[0], &t[1], &t[2], &t[3], &t[4], 16));
}
