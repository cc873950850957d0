//! Causal depthwise conv1d with carried state (docs/model.md §3.4 step 2, §4).
//!
//! `x` is `[T, C]` (pre-conv inputs), `state` is `[K-1, C]` (the previous inputs, oldest
//! first, zeros at sequence start), `weight` is `[C, K]` with `w[c][K-1]` multiplying the
//! current token. Output `[T, C]` before the activation; the state becomes the last `K-1`
//! inputs of `[state ‖ x]`.

/// Runs the conv over `x` and advances `state`.
pub fn causal_conv1d(x: &[f32], state: &mut [f32], weight: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    let t = x.len() / channels;
    let past = kernel - 1;
    // The input with its history in front: [K-1 + T, C].
    let mut ext = Vec::with_capacity((past + t) * channels);
    ext.extend_from_slice(state);
    ext.extend_from_slice(x);
    let mut y = vec![0.0f32; t * channels];
    for i in 0..t {
        let yr = &mut y[i * channels..(i + 1) * channels];
        for j in 0..kernel {
            let xr = &ext[(i + j) * channels..(i + j + 1) * channels];
            for (c, (o, v)) in yr.iter_mut().zip(xr).enumerate() {
                *o += weight[c * kernel + j] * v;
            }
        }
    }
    state.copy_from_slice(&ext[t * channels..]);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_in_pieces_equals_one_pass_and_kernel_orientation_is_causal() {
        let (c, k) = (3, 4);
        let w: Vec<f32> = (0..c * k).map(|i| i as f32 + 1.0).collect();
        let x: Vec<f32> = (0..10 * c).map(|i| (i as f32).sin()).collect();
        let mut s1 = vec![0.0; (k - 1) * c];
        let full = causal_conv1d(&x, &mut s1, &w, c, k);
        let mut s2 = vec![0.0; (k - 1) * c];
        let mut pieces = causal_conv1d(&x[..4 * c], &mut s2, &w, c, k);
        for i in 4..10 {
            pieces.extend(causal_conv1d(&x[i * c..(i + 1) * c], &mut s2, &w, c, k));
        }
        assert_eq!(full, pieces);
        assert_eq!(s1, s2);
        // First token sees only itself, through the last tap.
        assert_eq!(full[0], w[k - 1] * x[0]);
    }
}
