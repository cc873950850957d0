//! Turning logits into the next token: logit bias, repetition / presence / frequency
//! penalties, temperature, top-k, top-p, min-p, a seeded draw; and the model's
//! log-probabilities for what was chosen.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};

use crate::constraint::TokenMask;

/// How to pick tokens. `temperature == 0` is greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Nucleus mass kept (1 keeps everything).
    pub top_p: f32,
    /// Most likely tokens kept (0 keeps everything).
    pub top_k: usize,
    /// Drop tokens below `min_p ×` the top probability (0 disables).
    pub min_p: f32,
    /// CTRL-style penalty on tokens already in the prompt or output (1 disables).
    pub repetition_penalty: f32,
    /// Seed of the draw; `None` seeds from the clock.
    pub seed: Option<u64>,
    /// OpenAI's presence penalty (-2..2, 0 disables): subtracted once from the logit of
    /// every token generated so far in this reply (the prompt does not count).
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty (-2..2, 0 disables): subtracted from a token's logit once
    /// for every time it was generated so far in this reply.
    pub frequency_penalty: f32,
    /// OpenAI's `logit_bias`: `(token id, bias)` pairs added to the logits before anything
    /// else (-100..100; ±100 in practice bans or forces the token). Ids past the logits are
    /// ignored: the caller checks them against the vocabulary.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

/// OpenAI's range of `presence_penalty` and `frequency_penalty`.
pub const PENALTY_RANGE: std::ops::RangeInclusive<f32> = -2.0..=2.0;
/// OpenAI's range of a `logit_bias` value.
pub const LOGIT_BIAS_RANGE: std::ops::RangeInclusive<f32> = -100.0..=100.0;

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    /// Checks ranges; the message starts with the field's name.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be ≥ 0, found {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], found {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], found {}", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(format!("repetition_penalty must be > 0, found {}", self.repetition_penalty));
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !PENALTY_RANGE.contains(&v) {
                return Err(format!("{name} must be in [-2, 2], found {v}"));
            }
        }
        for &(id, bias) in &self.logit_bias {
            if !LOGIT_BIAS_RANGE.contains(&bias) {
                return Err(format!("logit_bias of token {id} must be in [-100, 100], found {bias}"));
            }
        }
        Ok(())
    }
}

/// One chosen token with its log-probability and, if asked, the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenChoice {
    /// The token.
    pub id: u32,
    /// log p(id) under the model's own distribution (raw logits, before any processing).
    pub logprob: f32,
    /// The `n` most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// A seeded sampler for one reply: it remembers what it chose, for the presence and
/// frequency penalties.
pub struct Sampler {
    params: SamplingParams,
    rng: rand::rngs::StdRng,
    /// How often each token was chosen so far (kept only when a penalty needs it).
    generated: HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler with `params` (seeded from `params.seed` or the clock).
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        Sampler { params, rng: rand::rngs::StdRng::seed_from_u64(seed), generated: HashMap::new() }
    }

    /// The parameters in use.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The logits the draw sees, in this order: `logit_bias` added; the repetition penalty
    /// on every token of `history` (prompt and output); then OpenAI's penalties over the
    /// tokens this sampler has chosen, `logit -= count × frequency_penalty + (count > 0) ×
    /// presence_penalty`.
    pub fn adjusted_logits(&self, logits: &[f32], history: &[u32]) -> Vec<f32> {
        let p = &self.params;
        let mut l = logits.to_vec();
        for &(id, bias) in &p.logit_bias {
            if let Some(v) = l.get_mut(id as usize) {
                *v += bias;
            }
        }
        if p.repetition_penalty != 1.0 {
            let mut seen = vec![false; l.len()];
            for &t in history {
                if let Some(s) = seen.get_mut(t as usize) {
                    *s = true;
                }
            }
            for (v, s) in l.iter_mut().zip(&seen) {
                if *s {
                    *v = if *v > 0.0 { *v / p.repetition_penalty } else { *v * p.repetition_penalty };
                }
            }
        }
        for (&id, &count) in &self.generated {
            if let Some(v) = l.get_mut(id as usize) {
                *v -= count as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
        l
    }

    /// Picks the next token from `logits`; `history` is every token so far (prompt and
    /// output), for the repetition penalty; `top_n` alternatives are reported. The reported
    /// log-probabilities are the model's own (raw logits), whatever was adjusted for the draw.
    pub fn sample(&mut self, logits: &[f32], history: &[u32], top_n: usize) -> TokenChoice {
        self.sample_masked(logits, history, top_n, None)
    }

    /// [`sample`](Self::sample) among the tokens `mask` allows (a grammar's, see
    /// [`crate::constraint`]): disallowed logits become −∞ after the bias and penalties and
    /// before temperature, top-k, top-p and min-p. The reported log-probabilities stay the
    /// model's own.
    pub fn sample_masked(
        &mut self,
        logits: &[f32],
        history: &[u32],
        top_n: usize,
        mask: Option<&TokenMask>,
    ) -> TokenChoice {
        let logprobs = log_softmax(logits);
        let mut l = self.adjusted_logits(logits, history);
        if let Some(mask) = mask {
            mask.apply(&mut l);
        }
        let id = if self.params.temperature == 0.0 { argmax(&l) } else { self.draw(&l) };
        if self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0 {
            *self.generated.entry(id).or_default() += 1;
        }
        TokenChoice { id, logprob: logprobs[id as usize], top: top_n_of(&logprobs, top_n) }
    }

    /// [`sample_masked`](Self::sample_masked) at a position where speculative decoding
    /// drafted `draft`: greedy picks the same token as ever; with sampling, the draft is kept
    /// with the probability this sampler's distribution gives it and otherwise a token is
    /// drawn from the rest ([`crate::speculative::pick_after_draft`]), so the token still
    /// follows that distribution (temperature, top-k/p, min-p, penalties and bias included).
    pub fn sample_after_draft(
        &mut self,
        logits: &[f32],
        history: &[u32],
        top_n: usize,
        mask: Option<&TokenMask>,
        draft: u32,
    ) -> TokenChoice {
        if self.params.temperature == 0.0 {
            return self.sample_masked(logits, history, top_n, mask);
        }
        let logprobs = log_softmax(logits);
        let mut l = self.adjusted_logits(logits, history);
        if let Some(mask) = mask {
            mask.apply(&mut l);
        }
        let (idx, probs) = self.distribution(&l);
        let id = if idx.is_empty() {
            0
        } else {
            let (u1, u2) = (self.rng.random::<f32>(), self.rng.random::<f32>());
            crate::speculative::pick_after_draft(&idx, &probs, draft, u1, u2)
        };
        if self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0 {
            *self.generated.entry(id).or_default() += 1;
        }
        TokenChoice { id, logprob: logprobs[id as usize], top: top_n_of(&logprobs, top_n) }
    }

    /// The tokens a draw picks among and their probabilities (not renormalised after top-p
    /// and min-p), best first: top-k, the softmax at the temperature, top-p, min-p.
    fn distribution(&self, logits: &[f32]) -> (Vec<u32>, Vec<f32>) {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        // Candidates sorted by logit, best first; cut by top-k before the softmax.
        let mut idx: Vec<u32> = (0..logits.len() as u32).filter(|&i| logits[i as usize].is_finite()).collect();
        if idx.is_empty() {
            return (idx, Vec::new());
        }
        let k = if p.top_k == 0 { idx.len() } else { p.top_k.min(idx.len()) };
        if k < idx.len() {
            idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
            idx.truncate(k);
        }
        idx.sort_unstable_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let m = logits[idx[0] as usize] * inv_t;
        let mut probs: Vec<f32> = idx.iter().map(|&i| (logits[i as usize] * inv_t - m).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        // top-p: smallest prefix whose mass reaches top_p (always at least one token).
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                acc += pr;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        // min-p: relative to the most likely token.
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p;
            keep = keep.min(probs.iter().take_while(|&&x| x >= floor).count().max(1));
        }
        probs.truncate(keep);
        idx.truncate(keep);
        (idx, probs)
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let (idx, probs) = self.distribution(logits);
        if idx.is_empty() {
            return 0;
        }
        let keep = probs.len();
        let total: f32 = probs.iter().sum();
        let mut u = self.rng.random::<f32>() * total;
        for (i, pr) in probs.iter().enumerate() {
            if u < *pr {
                return idx[i];
            }
            u -= pr;
        }
        idx[keep - 1]
    }
}

/// Index of the largest value (first on ties).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// `log softmax(x)`.
pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
    x.iter().map(|v| v - lse).collect()
}

fn top_n_of(logprobs: &[f32], n: usize) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let mut idx: Vec<u32> = (0..logprobs.len() as u32).collect();
    let n = n.min(idx.len());
    idx.select_nth_unstable_by(n - 1, |&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]));
    idx.truncate(n);
    idx.sort_unstable_by(|&a, &b| logprobs[b as usize].total_cmp(&logprobs[a as usize]));
    idx.into_iter().map(|i| (i, logprobs[i as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(params: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut s = Sampler::new(SamplingParams { seed: Some(1), ..params });
        let mut c = vec![0; logits.len()];
        for _ in 0..n {
            c[s.sample(logits, &[], 0).id as usize] += 1;
        }
        c
    }

    /// A draft changes nothing in the distribution: picks after a draft (temperature, top-k
    /// and a presence penalty in play) against the plain sampler's probabilities, by
    /// chi-square (3 degrees of freedom for the 4 tokens top-k keeps; 16.27 is the 0.1 %
    /// critical value).
    #[test]
    fn picks_after_a_draft_follow_the_samplers_own_distribution() {
        let logits = [1.0f32, 0.2, 2.0, -0.5, 0.7, -3.0];
        let params = SamplingParams { temperature: 0.8, top_k: 4, seed: Some(5), ..Default::default() };
        let (idx, probs) = Sampler::new(params.clone()).distribution(&logits);
        let total: f32 = probs.iter().sum();
        let n = 100_000;
        for draft in [2u32, 4, 5] {
            let mut s = Sampler::new(params.clone());
            let mut c = [0usize; 6];
            for _ in 0..n {
                c[s.sample_after_draft(&logits, &[], 0, None, draft).id as usize] += 1;
            }
            let chi2: f64 = idx
                .iter()
                .zip(&probs)
                .map(|(&i, &p)| {
                    let e = (p / total) as f64 * n as f64;
                    (c[i as usize] as f64 - e).powi(2) / e
                })
                .sum();
            assert!(chi2 < 16.27, "draft {draft}: chi-square {chi2:.2}, counts {c:?}");
            assert_eq!(c[5] + c[3], 0, "tokens outside top-k are never picked, a draft of one either: {c:?}");
        }
    }

    #[test]
    fn greedy_picks_argmax_and_reports_logprobs() {
        let mut s = Sampler::new(SamplingParams::greedy());
        let c = s.sample(&[0.0, 2.0, 1.0], &[], 2);
        assert_eq!(c.id, 1);
        let lp = log_softmax(&[0.0, 2.0, 1.0]);
        assert_eq!(c.logprob, lp[1]);
        assert_eq!(c.top, vec![(1, lp[1]), (2, lp[2])]);
    }

    #[test]
    fn top_k_and_top_p_and_min_p_restrict_the_draw() {
        let logits = [3.0, 2.9, 0.0, -1.0];
        let c = counts(SamplingParams { top_k: 2, ..Default::default() }, &logits, 2000);
        assert!(c[0] > 0 && c[1] > 0 && c[2] == 0 && c[3] == 0, "{c:?}");
        let c = counts(SamplingParams { top_p: 0.4, ..Default::default() }, &logits, 2000);
        assert!(c[0] == 2000, "{c:?}");
        let c = counts(SamplingParams { min_p: 0.5, ..Default::default() }, &logits, 2000);
        assert!(c[2] == 0 && c[3] == 0 && c[1] > 0, "{c:?}");
        let c = counts(SamplingParams::default(), &logits, 4000);
        assert!(c.iter().all(|&x| x > 0), "{c:?}");
    }

    /// Temperature divides the logits before the softmax: below 1 the draw concentrates on the
    /// top token, above 1 it spreads towards the rest, at the rates the tempered softmax says.
    #[test]
    fn temperature_sharpens_below_one_and_flattens_above() {
        let logits = [2.0, 1.0, 0.0, -1.0];
        let n = 20_000;
        let freq = |temperature: f32| {
            let c = counts(SamplingParams { temperature, ..Default::default() }, &logits, n);
            c.iter().map(|&x| x as f64 / n as f64).collect::<Vec<_>>()
        };
        let exact = |temperature: f64| {
            let e: Vec<f64> = logits.iter().map(|&l| (l as f64 / temperature).exp()).collect();
            let z: f64 = e.iter().sum();
            e.into_iter().map(|x| x / z).collect::<Vec<_>>()
        };
        let (cold, plain, hot) = (freq(0.5), freq(1.0), freq(2.0));
        // The top token's probability is 0.865 at T=0.5, 0.644 at T=1 and 0.455 at T=2: gaps of
        // ~55 standard deviations of a 20 000-draw frequency (≤ 0.0036), and the draw is seeded.
        assert!(cold[0] > plain[0] + 0.1, "T=0.5 should sharpen: {cold:?} vs T=1 {plain:?}");
        assert!(hot[0] < plain[0] - 0.1, "T=2 should flatten: {hot:?} vs T=1 {plain:?}");
        assert!(
            hot[3] > plain[3] && plain[3] > cold[3],
            "the least likely token gains with T: {cold:?} {plain:?} {hot:?}"
        );
        for (t, got) in [(0.5, &cold), (1.0, &plain), (2.0, &hot)] {
            for (g, w) in got.iter().zip(exact(t)) {
                // 0.02 is over five standard deviations for every token here.
                assert!((g - w).abs() < 0.02, "T={t}: frequencies {got:?} vs softmax(l/T) {:?}", exact(t));
            }
        }
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = || {
            let mut s = Sampler::new(SamplingParams { seed: Some(42), ..Default::default() });
            (0..20).map(|_| s.sample(&logits, &[], 0).id).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn repetition_penalty_discourages_seen_tokens() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..SamplingParams::greedy() });
        assert_eq!(s.sample(&[1.0, 0.8], &[0], 0).id, 1);
        assert_eq!(s.sample(&[1.0, 0.8], &[], 0).id, 0);
    }

    #[test]
    fn invalid_params_are_named() {
        let e = SamplingParams { top_p: 0.0, ..Default::default() }.validate().unwrap_err();
        assert!(e.contains("top_p"));
        let e = SamplingParams { temperature: -1.0, ..Default::default() }.validate().unwrap_err();
        assert!(e.contains("temperature"));
        let e = SamplingParams { presence_penalty: 2.5, ..Default::default() }.validate().unwrap_err();
        assert_eq!(e, "presence_penalty must be in [-2, 2], found 2.5");
        let e = SamplingParams { frequency_penalty: f32::NAN, ..Default::default() }.validate().unwrap_err();
        assert!(e.starts_with("frequency_penalty must be in [-2, 2]"), "{e}");
        let e = SamplingParams { logit_bias: vec![(3, 100.5)], ..Default::default() }.validate().unwrap_err();
        assert_eq!(e, "logit_bias of token 3 must be in [-100, 100], found 100.5");
        SamplingParams {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: vec![(0, -100.0)],
            ..Default::default()
        }
        .validate()
        .unwrap();
    }

    /// A bias of +100 forces its token, in a greedy pick and in every draw at temperature 1,
    /// however unlikely the model thinks it is; -100 bans the model's favourite.
    #[test]
    fn logit_bias_forces_or_bans_a_token() {
        let logits = [8.0, 2.0, -6.0, 0.5];
        let mut greedy = Sampler::new(SamplingParams { logit_bias: vec![(2, 100.0)], ..SamplingParams::greedy() });
        let c = greedy.sample(&logits, &[], 0);
        assert_eq!(c.id, 2);
        // The reported log-probability is the model's own, not the biased one.
        assert_eq!(c.logprob, log_softmax(&logits)[2]);
        let c = counts(SamplingParams { logit_bias: vec![(2, 100.0)], ..Default::default() }, &logits, 2000);
        assert_eq!(c, vec![0, 0, 2000, 0]);
        let c = counts(SamplingParams { logit_bias: vec![(0, -100.0)], ..Default::default() }, &logits, 2000);
        assert_eq!(c[0], 0, "{c:?}");
        // An id past the logits changes nothing.
        let mut s = Sampler::new(SamplingParams { logit_bias: vec![(99, 100.0)], ..SamplingParams::greedy() });
        assert_eq!(s.sample(&logits, &[], 0).id, 0);
    }

    /// OpenAI's definition, exactly: after token 0 was generated three times and token 1 once,
    /// their logits drop by 3·f + p and 1·f + p, the others not at all (the prompt does not
    /// count), so each probability ratio to an untouched token shrinks by exactly exp of that.
    #[test]
    fn presence_and_frequency_penalties_lower_generated_tokens_by_the_exact_amount() {
        let (f, p) = (0.5f32, 0.25f32);
        let params = SamplingParams { frequency_penalty: f, presence_penalty: p, ..SamplingParams::greedy() };
        let mut s = Sampler::new(params);
        let prompt = [2u32, 2, 3];
        // Force the picks 0, 0, 0, 1 with logits that make them the greedy choice.
        for pick in [0usize, 0, 0, 1] {
            let mut l = vec![0.0f32; 4];
            l[pick] = 1000.0;
            assert_eq!(s.sample(&l, &prompt, 0).id as usize, pick);
        }
        let logits = [1.0f32, 2.0, 3.0, -1.0];
        let got = s.adjusted_logits(&logits, &prompt);
        assert_eq!(got, vec![1.0 - (3.0 * f + p), 2.0 - (f + p), 3.0, -1.0]);
        let before = log_softmax(&logits);
        let after = log_softmax(&got);
        let drop = |i: usize| (before[i] - before[3]) - (after[i] - after[3]);
        assert!((drop(0) - (3.0 * f + p)).abs() < 1e-5, "{}", drop(0));
        assert!((drop(1) - (f + p)).abs() < 1e-5, "{}", drop(1));
        assert!(drop(2).abs() < 1e-6);
        // The penalised favourite loses: token 0's 3.0 becomes 1.25, below token 2's 2.9.
        assert_eq!(s.sample(&[3.0, 0.0, 2.9, 0.0], &prompt, 0).id, 2);
        // A fresh sampler (a new reply) starts without counts.
        let fresh =
            Sampler::new(SamplingParams { frequency_penalty: f, presence_penalty: p, ..SamplingParams::greedy() });
        assert_eq!(fresh.adjusted_logits(&logits, &prompt), logits.to_vec());
        // Negative penalties encourage repetition.
        let mut s = Sampler::new(SamplingParams { presence_penalty: -1.0, ..SamplingParams::greedy() });
        assert_eq!(s.sample(&[0.0, 1000.0], &[], 0).id, 1);
        assert_eq!(s.sample(&[1.5, 1.0], &[], 0).id, 1, "1.0 + 1 beats 1.5");
    }
}
