//! Group advantages and the clipped token-level policy loss (docs/rl.md §2).
//!
//! A group is the G attempts on one task. Only scored attempts ([`Outcome::Scored`]) take part:
//! attempts cut by limits or broken by infrastructure are masked, never scored 0. A group with
//! fewer than two scored attempts, or whose rewards are all equal, carries no gradient; it is
//! counted, not trained on.

use candle_core::{Result as CandleResult, Tensor};
use serde::{Deserialize, Serialize};

use crate::rollout::{Outcome, Rollout};

/// How rewards become advantages within a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageEstimator {
    /// Leave-one-out (RLOO / LOOP): `A_j = r_j − mean_{k≠j} r_k`.
    Loo,
    /// Group mean baseline (GRPO): `A_j = r_j − mean(r)`, divided by the group std when
    /// `norm_by_std` is set.
    Grpo,
}

/// Advantage settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdvantageConfig {
    /// The estimator.
    pub estimator: AdvantageEstimator,
    /// Divide by the group's reward std (GRPO's original form; off by default, as DeepSWE and
    /// SA-SWE train).
    pub norm_by_std: bool,
}

impl Default for AdvantageConfig {
    fn default() -> Self {
        AdvantageConfig { estimator: AdvantageEstimator::Loo, norm_by_std: false }
    }
}

/// What a group contributes.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupAdvantages {
    /// One entry per attempt, in order: `Some(A)` for a scored attempt of a usable group,
    /// `None` for a masked attempt or any attempt of an unusable group.
    pub advantages: Vec<Option<f32>>,
    /// Whether the group carries gradient (≥ 2 scored attempts with different rewards).
    pub usable: bool,
}

/// Advantages of one group from its outcomes.
pub fn group_advantages(outcomes: &[Outcome], cfg: &AdvantageConfig) -> GroupAdvantages {
    let rewards: Vec<Option<f32>> = outcomes.iter().map(Outcome::reward).collect();
    let scored: Vec<f32> = rewards.iter().flatten().copied().collect();
    let n = scored.len();
    let all_equal = scored.windows(2).all(|w| w[0] == w[1]);
    if n < 2 || all_equal {
        return GroupAdvantages { advantages: vec![None; outcomes.len()], usable: false };
    }
    let sum: f32 = scored.iter().sum();
    let mean = sum / n as f32;
    let std = (scored.iter().map(|r| (r - mean).powi(2)).sum::<f32>() / n as f32).sqrt();
    let advantages = rewards
        .iter()
        .map(|r| {
            r.map(|r| {
                let a = match cfg.estimator {
                    AdvantageEstimator::Loo => r - (sum - r) / (n - 1) as f32,
                    AdvantageEstimator::Grpo => r - mean,
                };
                if cfg.norm_by_std {
                    a / (std + 1e-6)
                } else {
                    a
                }
            })
        })
        .collect();
    GroupAdvantages { advantages, usable: true }
}

/// How per-token losses are reduced over a mini-batch (docs/rl.md §2, "Aggregation").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// Σ m·ℓ / Σ m over the whole mini-batch (DAPO).
    TokenMean,
    /// Mean over sequences of each sequence's token mean (original GRPO; length-biased).
    SequenceMean,
    /// Σ m·ℓ / (N · L_max) with a constant `L_max` (Dr. GRPO).
    SeqMeanTokenSumNorm,
    /// Mean over groups of each group's token mean: every task weighs the same.
    PromptMean,
}

/// Which policy-gradient objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyLoss {
    /// PPO-style clipped ratio with asymmetric clipping (and optional dual clip).
    Ppo,
    /// Plain importance sampling `−ρ·A` (what a server without clipping offers).
    ImportanceSampling,
}

/// Loss settings. Defaults: clip-higher 0.2 / 0.28, no dual clip, token mean, no KL term.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossConfig {
    /// The objective.
    pub kind: PolicyLoss,
    /// ε_low: the ratio is clipped below at 1 − ε_low.
    pub clip_low: f32,
    /// ε_high: the ratio is clipped above at 1 + ε_high.
    pub clip_high: f32,
    /// Dual clip constant c (> 1): for negative advantages the loss is bounded by −c·A.
    pub dual_clip: Option<f32>,
    /// Reduction over tokens and sequences.
    pub aggregation: Aggregation,
    /// `L_max` for [`Aggregation::SeqMeanTokenSumNorm`].
    pub max_len: usize,
    /// Truncated importance weighting against sampler/trainer mismatch (docs/rl.md §2,
    /// "Truncated importance weighting"): the ratio is taken against the trainer's own logprobs before
    /// the update, and each token's loss is weighted by min(π_trainer/π_sampler, cap).
    #[serde(default)]
    pub tis_cap: Option<f32>,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            kind: PolicyLoss::Ppo,
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: None,
            aggregation: Aggregation::TokenMean,
            max_len: 40_768,
            tis_cap: None,
        }
    }
}

/// One trainable sequence: a rollout with its advantage, shifted for next-token training.
#[derive(Debug, Clone, PartialEq)]
pub struct Datum {
    /// `S[0..n−1]`.
    pub input: Vec<u32>,
    /// `S[1..n]`.
    pub targets: Vec<u32>,
    /// Sampling logprob of each target (0 where the weight is 0).
    pub old_logprobs: Vec<f32>,
    /// The trainer's logprob of each target before this step's first update, when truncated
    /// importance weighting needs it across several mini-batches (`None`: taken from the
    /// current forward pass, which is the same thing in the first mini-batch).
    pub trainer_logprobs: Option<Vec<f32>>,
    /// Loss weight of each target (1 = sampled by the policy).
    pub weights: Vec<f32>,
    /// The trajectory's advantage.
    pub advantage: f32,
    /// Index of the group the sequence belongs to (for [`Aggregation::PromptMean`]).
    pub group: usize,
    /// The factor this sequence's summed token losses are multiplied by, so that summing over
    /// the mini-batch gives its [`Aggregation`] (set by [`set_scales`]).
    pub scale: f32,
}

impl Datum {
    /// Builds the shifted datum of `r` (`None` if it has no loss-bearing token).
    pub fn from_rollout(r: &Rollout, advantage: f32, group: usize) -> Option<Datum> {
        let n = r.tokens.len();
        if n < 2 || r.weights[1..].iter().all(|&w| w == 0) {
            return None;
        }
        Some(Datum {
            input: r.tokens[..n - 1].to_vec(),
            targets: r.tokens[1..].to_vec(),
            old_logprobs: r.logprobs[1..].to_vec(),
            trainer_logprobs: None,
            weights: r.weights[1..].iter().map(|&w| w as f32).collect(),
            advantage,
            group,
            scale: 1.0,
        })
    }

    /// Tokens that carry loss.
    pub fn loss_tokens(&self) -> f32 {
        self.weights.iter().sum()
    }
}

/// Sets every datum's [`Datum::scale`] for a mini-batch so that Σ_j scale_j Σ_t m ℓ is the
/// configured aggregation. Computing the normaliser over the whole mini-batch first lets the
/// trainer back-propagate one sequence at a time.
pub fn set_scales(batch: &mut [Datum], cfg: &LossConfig) {
    let n = batch.len() as f32;
    let total: f32 = batch.iter().map(Datum::loss_tokens).sum();
    let mut group_tokens = std::collections::BTreeMap::<usize, f32>::new();
    for d in batch.iter() {
        *group_tokens.entry(d.group).or_default() += d.loss_tokens();
    }
    let groups = group_tokens.len() as f32;
    for d in batch.iter_mut() {
        let m = d.loss_tokens().max(1.0);
        d.scale = match cfg.aggregation {
            Aggregation::TokenMean => 1.0 / total.max(1.0),
            Aggregation::SequenceMean => 1.0 / (n * m),
            Aggregation::SeqMeanTokenSumNorm => 1.0 / (n * cfg.max_len.max(1) as f32),
            Aggregation::PromptMean => 1.0 / (groups * group_tokens[&d.group].max(1.0)),
        };
    }
}

/// Statistics of one sequence's loss (summed over its loss-bearing tokens, unscaled).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// Loss-bearing tokens.
    pub tokens: f32,
    /// Tokens whose ratio was clipped (the clipped term was the active one).
    pub clipped: f32,
    /// Σ m·ρ.
    pub ratio_sum: f32,
    /// Σ m·|log π_θ − log π_old|: how far the trainer's logprobs are from the sampler's.
    pub abs_logprob_gap: f32,
    /// Σ m·(log π_old − log π_θ): the k1 estimate of KL(π_old ‖ π_θ), summed.
    pub kl_sum: f32,
}

impl std::ops::AddAssign for LossStats {
    fn add_assign(&mut self, o: Self) {
        self.tokens += o.tokens;
        self.clipped += o.clipped;
        self.ratio_sum += o.ratio_sum;
        self.abs_logprob_gap += o.abs_logprob_gap;
        self.kl_sum += o.kl_sum;
    }
}

/// The scaled loss of one datum, `scale · Σ_t m_t ℓ_t`, as a scalar tensor to back-propagate,
/// from the trainer's logprobs `new_logprobs` (`[n]`, differentiable) of its targets.
pub fn sequence_loss(new_logprobs: &Tensor, d: &Datum, cfg: &LossConfig) -> CandleResult<(Tensor, LossStats)> {
    let dev = new_logprobs.device();
    let n = d.targets.len();
    let sampler = Tensor::from_slice(&d.old_logprobs, n, dev)?.to_dtype(new_logprobs.dtype())?;
    let mut w = Tensor::from_slice(&d.weights, n, dev)?.to_dtype(new_logprobs.dtype())?;
    let a = d.advantage as f64;
    // With truncated importance weighting the ratio is taken against the trainer's own
    // logprobs and the sampler/trainer mismatch enters as a capped per-token weight.
    let old = match cfg.tis_cap {
        None => sampler,
        Some(cap) => {
            let trainer = match &d.trainer_logprobs {
                Some(v) => Tensor::from_slice(v, n, dev)?.to_dtype(new_logprobs.dtype())?,
                None => new_logprobs.detach(),
            };
            let is_weight = (&trainer - &sampler)?.exp()?.clamp(0.0, cap)?;
            w = (w * is_weight)?;
            trainer
        }
    };
    let log_ratio = (new_logprobs - &old)?;
    let ratio = log_ratio.exp()?;
    let per_token = match cfg.kind {
        PolicyLoss::ImportanceSampling => (ratio.clone() * -a)?,
        PolicyLoss::Ppo => {
            let unclipped = (ratio.clone() * a)?;
            let clipped = (ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)? * a)?;
            let mut loss = unclipped.minimum(&clipped)?.neg()?;
            if let (Some(c), true) = (cfg.dual_clip, a < 0.0) {
                // ℓ ≤ −c·A: a very unlikely token with a negative advantage cannot blow up.
                loss = loss.clamp(f32::NEG_INFINITY, (-(c as f64) * a) as f32)?;
            }
            loss
        }
    };
    let loss = ((per_token * &w)?.sum_all()? * d.scale as f64)?;

    // Statistics on plain numbers.
    let lr: Vec<f32> = log_ratio.to_dtype(candle_core::DType::F32)?.to_vec1()?;
    let new: Vec<f32> = new_logprobs.to_dtype(candle_core::DType::F32)?.to_vec1()?;
    let mut s = LossStats::default();
    for (t, &m) in d.weights.iter().enumerate() {
        if m == 0.0 {
            continue;
        }
        let rho = lr[t].exp();
        s.tokens += m;
        s.ratio_sum += m * rho;
        // The gap is always against the sampler, whatever the ratio is taken against.
        s.abs_logprob_gap += m * (new[t] - d.old_logprobs[t]).abs();
        s.kl_sum += m * -lr[t];
        let clipped = match cfg.kind {
            PolicyLoss::Ppo => {
                (d.advantage > 0.0 && rho > 1.0 + cfg.clip_high) || (d.advantage < 0.0 && rho < 1.0 - cfg.clip_low)
            }
            PolicyLoss::ImportanceSampling => false,
        };
        if clipped {
            s.clipped += m;
        }
    }
    Ok((loss, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn scored(r: f32) -> Outcome {
        Outcome::Scored { reward: r }
    }

    #[test]
    fn leave_one_out_by_hand() {
        // r = [1, 0, 0, 1]: mean of the others for j=0 is 1/3 → A = 2/3; for j=1: 2/3 → −2/3.
        let g = group_advantages(&[scored(1.0), scored(0.0), scored(0.0), scored(1.0)], &AdvantageConfig::default());
        assert!(g.usable);
        let a: Vec<f32> = g.advantages.iter().map(|a| a.unwrap()).collect();
        for (got, want) in a.iter().zip([2.0 / 3.0, -2.0 / 3.0, -2.0 / 3.0, 2.0 / 3.0]) {
            assert!((got - want).abs() < 1e-6, "{a:?}");
        }
        // LOO = G/(G−1)·(r − mean).
        let g8 = group_advantages(&[scored(1.0), scored(0.0), scored(0.0)], &AdvantageConfig::default());
        assert!((g8.advantages[0].unwrap() - 1.5 * (1.0 - 1.0 / 3.0)).abs() < 1e-6);
    }

    #[test]
    fn masked_attempts_do_not_enter_the_baseline() {
        let limit = Outcome::Limit { reason: "max_turns".into() };
        let infra = Outcome::Infra { reason: "sandbox".into() };
        let g = group_advantages(&[scored(1.0), limit, scored(0.0), infra], &AdvantageConfig::default());
        assert!(g.usable);
        assert_eq!(g.advantages, vec![Some(1.0), None, Some(-1.0), None]);
    }

    #[test]
    fn degenerate_groups_carry_nothing() {
        let cfg = AdvantageConfig::default();
        assert!(!group_advantages(&vec![scored(1.0); 4], &cfg).usable);
        assert!(!group_advantages(&vec![scored(0.0); 4], &cfg).usable);
        let only_one = [scored(1.0), Outcome::Limit { reason: "max_time".into() }];
        let g = group_advantages(&only_one, &cfg);
        assert!(!g.usable);
        assert_eq!(g.advantages, vec![None, None]);
    }

    #[test]
    fn grpo_with_and_without_std() {
        let outs = [scored(1.0), scored(0.0), scored(0.0), scored(0.0)];
        let plain =
            group_advantages(&outs, &AdvantageConfig { estimator: AdvantageEstimator::Grpo, norm_by_std: false });
        assert!((plain.advantages[0].unwrap() - 0.75).abs() < 1e-6);
        assert!((plain.advantages[1].unwrap() + 0.25).abs() < 1e-6);
        let normed =
            group_advantages(&outs, &AdvantageConfig { estimator: AdvantageEstimator::Grpo, norm_by_std: true });
        // std = sqrt(0.1875) = 0.4330.
        assert!((normed.advantages[0].unwrap() - 0.75 / 0.433_012_7).abs() < 1e-4);
    }

    fn datum(old: &[f32], w: &[f32], a: f32) -> Datum {
        Datum {
            input: vec![0; old.len()],
            targets: vec![0; old.len()],
            old_logprobs: old.to_vec(),
            trainer_logprobs: None,
            weights: w.to_vec(),
            advantage: a,
            group: 0,
            scale: 1.0,
        }
    }

    /// ℓ_t by hand for ratio ρ and advantage A with clip 0.2 / 0.28.
    fn by_hand(rho: f32, a: f32) -> f32 {
        -(rho * a).min(rho.clamp(0.8, 1.28) * a)
    }

    #[test]
    fn clipped_loss_and_gradient_by_hand() {
        let dev = Device::Cpu;
        // Ratios 1.5, 0.5, 1.1 and a masked token.
        let old = [-1.0f32, -1.0, -1.0, -2.0];
        let new = [-1.0 + 1.5f32.ln(), -1.0 + 0.5f32.ln(), -1.0 + 1.1f32.ln(), -0.1];
        let w = [1.0, 1.0, 1.0, 0.0];
        let cfg = LossConfig::default();
        for a in [1.0f32, -1.0] {
            let var = Var::from_slice(&new, 4, &dev).unwrap();
            let d = datum(&old, &w, a);
            let (loss, stats) = sequence_loss(var.as_tensor(), &d, &cfg).unwrap();
            let want: f32 = [1.5f32, 0.5, 1.1].iter().map(|&r| by_hand(r, a)).sum();
            let got = loss.to_scalar::<f32>().unwrap();
            assert!((got - want).abs() < 1e-5, "A={a}: {got} vs {want}");
            // dℓ/dlogπ = −ρ·A where the unclipped term is active, 0 where clipped, 0 when masked.
            let grads = loss.backward().unwrap();
            let g: Vec<f32> = grads.get(&var).unwrap().to_vec1().unwrap();
            let want_g = if a > 0.0 { [0.0, -0.5, -1.1, 0.0] } else { [1.5, 0.0, 1.1, 0.0] };
            for (x, y) in g.iter().zip(want_g) {
                assert!((x - y).abs() < 1e-5, "A={a}: grad {g:?} vs {want_g:?}");
            }
            assert_eq!(stats.tokens, 3.0);
            assert_eq!(stats.clipped, 1.0, "A={a}: exactly one token sits outside the clip range on its side");
        }
    }

    #[test]
    fn dual_clip_bounds_negative_advantage_losses() {
        let dev = Device::Cpu;
        let old = [-5.0f32];
        let new = Tensor::from_slice(&[-5.0 + 10f32.ln()], 1, &dev).unwrap(); // ρ = 10
        let cfg = LossConfig { dual_clip: Some(3.0), ..LossConfig::default() };
        let (loss, _) = sequence_loss(&new, &datum(&old, &[1.0], -1.0), &cfg).unwrap();
        assert!((loss.to_scalar::<f32>().unwrap() - 3.0).abs() < 1e-5);
        let (plain, _) = sequence_loss(&new, &datum(&old, &[1.0], -1.0), &LossConfig::default()).unwrap();
        assert!((plain.to_scalar::<f32>().unwrap() - 10.0).abs() < 1e-4);
    }

    #[test]
    fn truncated_importance_weights_by_hand() {
        let dev = Device::Cpu;
        // Sampler said −1.0; the trainer says −0.5 (π_t/π_s = e^0.5 = 1.6487) and −1.5 (0.6065).
        let new = [-0.5f32, -1.5];
        let d = datum(&[-1.0, -1.0], &[1.0, 1.0], 1.0);
        for (cap, w0) in [(2.0f32, 0.5f32.exp()), (1.2, 1.2)] {
            let var = Var::from_slice(&new, 2, &dev).unwrap();
            let cfg = LossConfig { tis_cap: Some(cap), ..LossConfig::default() };
            let (loss, _) = sequence_loss(var.as_tensor(), &d, &cfg).unwrap();
            let w1 = (-0.5f32).exp();
            // First pass: ratio 1 against the trainer's own logprobs, loss −Σ w·A.
            assert!((loss.to_scalar::<f32>().unwrap() + w0 + w1).abs() < 1e-5, "cap {cap}");
            let g: Vec<f32> = loss.backward().unwrap().get(&var).unwrap().to_vec1().unwrap();
            assert!((g[0] + w0).abs() < 1e-5 && (g[1] + w1).abs() < 1e-5, "cap {cap}: {g:?}");
        }
        // Given trainer logprobs (a later mini-batch), the ratio moves but the weight does not.
        let d2 = Datum { trainer_logprobs: Some(vec![-0.5, -1.5]), ..d };
        let moved = Tensor::from_slice(&[-0.5f32 + 0.1, -1.5], 2, &dev).unwrap();
        let cfg = LossConfig { tis_cap: Some(2.0), ..LossConfig::default() };
        let (loss, s) = sequence_loss(&moved, &d2, &cfg).unwrap();
        let want = -(0.5f32.exp() * 0.1f32.exp() + (-0.5f32).exp());
        assert!((loss.to_scalar::<f32>().unwrap() - want).abs() < 1e-5);
        assert!((s.ratio_sum - (0.1f32.exp() + 1.0)).abs() < 1e-5);
    }

    #[test]
    fn importance_sampling_is_minus_ratio_times_advantage() {
        let dev = Device::Cpu;
        let new = Tensor::from_slice(&[2f32.ln(), 0.0], 2, &dev).unwrap();
        let cfg = LossConfig { kind: PolicyLoss::ImportanceSampling, ..LossConfig::default() };
        let (loss, _) = sequence_loss(&new, &datum(&[0.0, 0.0], &[1.0, 1.0], 0.5), &cfg).unwrap();
        assert!((loss.to_scalar::<f32>().unwrap() + 0.5 * 3.0).abs() < 1e-5);
    }

    #[test]
    fn aggregations_by_hand() {
        // Two groups: group 0 has sequences of 2 and 6 loss tokens, group 1 one of 4.
        let mk = |m: usize, g: usize| Datum { group: g, ..datum(&vec![0.0; m], &vec![1.0; m], 1.0) };
        let mut b = vec![mk(2, 0), mk(6, 0), mk(4, 1)];
        let scales = |b: &mut Vec<Datum>, agg| {
            set_scales(b, &LossConfig { aggregation: agg, max_len: 10, ..LossConfig::default() });
            b.iter().map(|d| d.scale).collect::<Vec<_>>()
        };
        assert_eq!(scales(&mut b, Aggregation::TokenMean), vec![1.0 / 12.0; 3]);
        assert_eq!(scales(&mut b, Aggregation::SequenceMean), vec![1.0 / 6.0, 1.0 / 18.0, 1.0 / 12.0]);
        assert_eq!(scales(&mut b, Aggregation::SeqMeanTokenSumNorm), vec![1.0 / 30.0; 3]);
        assert_eq!(scales(&mut b, Aggregation::PromptMean), vec![1.0 / 16.0, 1.0 / 16.0, 1.0 / 8.0]);
        // A duplicated datum doubles a sum but leaves a token mean unchanged (rl-recipe §2).
        let mut dup = vec![mk(3, 0), mk(3, 0)];
        set_scales(&mut dup, &LossConfig::default());
        assert_eq!(dup[0].scale * 6.0, 1.0);
    }

    #[test]
    fn datum_shifts_by_one() {
        let r = Rollout {
            task_id: "t".into(),
            group: 0,
            attempt: 0,
            policy_version: 0,
            seed: 0,
            tokens: vec![10, 11, 12, 13],
            logprobs: vec![0.0, 0.0, -0.5, -0.25],
            weights: vec![0, 0, 1, 1],
            turn_starts: vec![2],
            exit: "agent".into(),
            outcome: scored(1.0),
            wall_s: 0.0,
        };
        let d = Datum::from_rollout(&r, 0.5, 3).unwrap();
        assert_eq!(d.input, vec![10, 11, 12]);
        assert_eq!(d.targets, vec![11, 12, 13]);
        assert_eq!(d.old_logprobs, vec![0.0, -0.5, -0.25]);
        assert_eq!(d.weights, vec![0.0, 1.0, 1.0]);
        let none = Rollout { weights: vec![0; 4], ..r };
        assert!(Datum::from_rollout(&none, 0.5, 0).is_none());
    }
}
