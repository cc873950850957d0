//! Speculative decoding (docs/speculative.md): drafts copied from the context (prompt
//! lookup) or predicted by the checkpoint's multi-token-prediction head ([`MtpDrafter`]),
//! checked in one forward, and the rule that keeps the output exact.
//!
//! A coding agent's replies copy their context all the time (an edit rewrites the lines it
//! keeps, a tool call repeats a path). [`LookupDrafter`] finds the last few tokens earlier in
//! the prompt or the reply and proposes what followed them there; the session runs the last
//! token and the drafts through [`frognano_model::CausalLm::forward_stepwise`] (the weights
//! are read once for all of them) and keeps the drafts the model itself would have produced.
//! Greedy output is plain decoding's to the token; with sampling, [`pick_after_draft`]
//! accepts a draft with the probability the model gives it and otherwise draws from the rest
//! of the distribution, so every token still follows the sampler's distribution.

use std::str::FromStr;

use frognano_model::{Cache, ModelError, MtpHead};

/// Longest n-gram matched against the context.
const MAX_NGRAM: usize = 3;
/// Most tokens drafted per step.
pub const MAX_DRAFT: usize = 15;
/// Drafted tokens per acceptance window of the MTP head's pause rule in `auto`.
const WINDOW: usize = 24;
/// Tokens decoded plainly after the first window that did not pay; doubled each time in a
/// row, up to [`MAX_PAUSE`].
const FIRST_PAUSE: usize = 32;
/// The longest pause.
const MAX_PAUSE: usize = 512;

/// Which drafts a session's generations try (`--speculative`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpeculativeMode {
    /// Plain decoding, one token per forward.
    None,
    /// Prompt-lookup drafts whenever the context has a match, whatever the acceptance.
    Lookup,
    /// Drafts of 1–4 tokens from the model's multi-token-prediction head, every step,
    /// whatever the acceptance (a model without the head decodes plainly).
    Mtp,
    /// For greedy replies, prompt-lookup drafts where the context has a match, else the MTP
    /// head's drafts when the model has one, each paused while it does not pay (the default). Sampled replies decode plainly,
    /// so a seeded one is the same text as on the scheduler's batched decode.
    #[default]
    Auto,
}

impl FromStr for SpeculativeMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" | "off" => Ok(SpeculativeMode::None),
            "lookup" => Ok(SpeculativeMode::Lookup),
            "auto" => Ok(SpeculativeMode::Auto),
            "mtp" => Ok(SpeculativeMode::Mtp),
            other => Err(format!("--speculative: expected none, lookup, mtp or auto, found {other:?}")),
        }
    }
}

impl std::fmt::Display for SpeculativeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpeculativeMode::None => "none",
            SpeculativeMode::Lookup => "lookup",
            SpeculativeMode::Mtp => "mtp",
            SpeculativeMode::Auto => "auto",
        })
    }
}

/// What speculation did over a session's generations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Verification forwards run (each one instead of a decode step).
    pub verifications: u64,
    /// Tokens drafted.
    pub drafted: u64,
    /// Drafted tokens the model agreed with.
    pub accepted: u64,
    /// Verifications after which a hybrid model's state was restored from a snapshot and the
    /// accepted tokens run again (long drafts).
    pub recomputed: u64,
    /// Verifications after which a hybrid model's state was brought back to the row of the
    /// last accepted token, kept during the verification (short drafts; no rerun).
    pub returned_to_row: u64,
}

/// `auto`'s rule for when the MTP head's drafts pay: over each window of [`WINDOW`] drafted
/// tokens, an acceptance below `min_acceptance` pauses drafting for a number of plain tokens that
/// doubles with each window in a row that did not pay.
#[derive(Debug, Clone)]
struct PauseGate {
    min_acceptance: f32,
    /// Drafted and accepted tokens in the current window.
    window: (usize, usize),
    /// Plain tokens left before drafting resumes.
    paused_for: usize,
    /// The next pause's length.
    next_pause: usize,
}

impl PauseGate {
    fn new(min_acceptance: f32) -> Self {
        PauseGate { min_acceptance, window: (0, 0), paused_for: 0, next_pause: FIRST_PAUSE }
    }

    /// True while paused; a paused call counts as one plain token.
    fn paused(&mut self) -> bool {
        if self.paused_for > 0 {
            self.paused_for -= 1;
            return true;
        }
        false
    }

    /// Records a verification; true when this closed a window that did not pay (a pause
    /// begins).
    fn record(&mut self, drafted: usize, accepted: usize) -> bool {
        self.window.0 += drafted;
        self.window.1 += accepted;
        if self.window.0 < WINDOW {
            return false;
        }
        let rate = self.window.1 as f32 / self.window.0 as f32;
        self.window = (0, 0);
        if rate < self.min_acceptance {
            self.paused_for = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
            true
        } else {
            self.next_pause = FIRST_PAUSE;
            false
        }
    }
}

/// Decay of `auto`'s counts of held and broken lookup drafts per observation, so they follow
/// the reply as it moves between copying and writing anew (about the last 30 observations
/// count).
const ODDS_DECAY: f32 = 0.97;
/// What each row of a verification beyond the first is taken to cost, as a share of a plain
/// decode step, until steps have been timed: a little above what a quiet Zen 3 measured for
/// Qwen2.5-Coder-1.5B Q4_K_M at two rows (bench/RESULTS.md, "Cost of a verification").
const PRIOR_ROW_COST: f64 = 0.3;
/// `auto` drafts only when a verification is expected to emit at least this many tokens per
/// plain step's worth of time (the margin covers the noise of the timings).
const MIN_GAIN: f64 = 1.05;
/// Timings kept per row count; their median is the step's time (a machine shared with other
/// work gives spikes, never dips).
const TIMINGS_KEPT: usize = 5;
/// Timings of a row count needed before its median replaces the estimate.
const TIMINGS_TRUSTED: usize = 3;
/// Declined drafts after which `auto` verifies one anyway, to time it again, when only the
/// measured cost (not the acceptance) stands against it: a slow spell of the machine must
/// not switch drafting off for good.
const PROBE_EVERY: usize = 64;
/// Draft lengths `auto` chooses between: one and two, then lengths whose verification fills
/// the quantized kernels' 4-row tiles ([`tile_aligned`]).
const AUTO_LENGTHS: [usize; 6] = [1, 2, 3, 7, 11, 15];

/// `auto`'s judgement of whether lookup drafts pay, by their measured cost and how often they
/// hold. A verification of `k` drafts emits `1 + s(1) + … + s(k)` tokens on average, `s(i)`
/// being the chance that the first `i` drafts all hold, and costs `c(k + 1)` plain steps,
/// `c(r)` being the measured time of an r-row step over a plain one; the gate drafts the `k`
/// with the best ratio when that ratio is at least [`MIN_GAIN`], and otherwise lets the step
/// run plainly. `s` is estimated position by position ([`Survival`]): a copied block tends to
/// hold on once its first tokens held, so a draft's later tokens are far surer than its
/// first, and a single per-token rate would cut long drafts short. It is counted separately
/// for drafts found by a 1-, 2- or 3-token match (a long match is a far better bet than a
/// single repeated word). A declined draft still teaches the gate for free: its first token
/// is compared with the token the model then produces, so `auto` notices when a reply starts
/// copying again without paying for a verification to find out.
#[derive(Debug, Clone)]
struct PayoffGate {
    /// How drafts held, per matched n-gram length n (index n − 1).
    held: [Survival; MAX_NGRAM],
    /// Seconds of the latest steps by row count (index 1: plain decode steps; index r: a
    /// verification of r − 1 drafts).
    times: [RecentTimes; MAX_DRAFT + 2],
    /// A declined draft's first token, waiting for the model's: (its position in the
    /// context, the token before it, the draft token, the match length).
    shadow: Option<(usize, u32, u32, usize)>,
    /// Drafts declined since the last one verified.
    declined: usize,
}

/// The latest [`TIMINGS_KEPT`] timings of one kind of step.
#[derive(Debug, Clone, Copy, Default)]
struct RecentTimes {
    secs: [f64; TIMINGS_KEPT],
    /// Timings taken so far (the latest ones are kept, round robin).
    taken: usize,
}

impl RecentTimes {
    fn push(&mut self, secs: f64) {
        self.secs[self.taken % TIMINGS_KEPT] = secs;
        self.taken += 1;
    }

    /// The median of the kept timings, once [`TIMINGS_TRUSTED`] were taken.
    fn median(&self) -> Option<f64> {
        if self.taken < TIMINGS_TRUSTED {
            return None;
        }
        let mut kept = self.secs[..self.taken.min(TIMINGS_KEPT)].to_vec();
        kept.sort_by(f64::total_cmp);
        Some(kept[kept.len() / 2])
    }
}

/// How far drafts hold, position by position: for draft position i (0-based), decayed counts
/// of drafts that reached it (every earlier draft token held) and of those that broke there.
/// The chance of breaking at a position is its breaks over its reached count, each smoothed by
/// one pseudo-draft at the prior rate: even odds for the first position, and for the later
/// ones the rate pooled over all later positions, so positions no draft has reached yet are
/// judged by the ones that have.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Survival {
    reached: [f32; MAX_DRAFT],
    broke: [f32; MAX_DRAFT],
}

impl Survival {
    const EMPTY: Survival = Survival { reached: [0.0; MAX_DRAFT], broke: [0.0; MAX_DRAFT] };

    /// Counts a draft of which the first `held` tokens held, out of `drafted` (`held <
    /// drafted`: it broke at position `held`); older counts decay by [`ODDS_DECAY`].
    fn count(&mut self, drafted: usize, held: usize) {
        for (r, b) in self.reached.iter_mut().zip(&mut self.broke) {
            *r *= ODDS_DECAY;
            *b *= ODDS_DECAY;
        }
        for r in &mut self.reached[..held.min(MAX_DRAFT)] {
            *r += 1.0;
        }
        if held < drafted && held < MAX_DRAFT {
            self.reached[held] += 1.0;
            self.broke[held] += 1.0;
        }
    }

    /// The chance that a draft's tokens up to position i all hold, for i = 0..k, summed: the
    /// tokens a verification of `k` drafts is expected to keep.
    fn expected_kept(&self, k: usize) -> f64 {
        let later = |v: &[f32]| f64::from(v[1..].iter().sum::<f32>());
        let pooled = (later(&self.broke) + 0.5) / (later(&self.reached) + 1.0);
        let mut alive = 1.0;
        let mut kept = 0.0;
        for i in 0..k.min(MAX_DRAFT) {
            let prior = if i == 0 { 0.5 } else { pooled };
            let hazard = (f64::from(self.broke[i]) + prior) / (f64::from(self.reached[i]) + 1.0);
            alive *= 1.0 - hazard;
            kept += alive;
        }
        kept
    }
}

impl PayoffGate {
    fn new() -> Self {
        PayoffGate {
            held: [Survival::EMPTY; MAX_NGRAM],
            times: [RecentTimes::default(); MAX_DRAFT + 2],
            shadow: None,
            declined: 0,
        }
    }

    /// The time of an r-row step over a plain one: the ratio of the medians when both are
    /// timed, otherwise the timed rows' mean cost per extra row (or [`PRIOR_ROW_COST`] before
    /// any) times r − 1; `measured` false takes the prior throughout.
    fn cost(&self, rows: usize, measured: bool) -> f64 {
        let plain = self.times[1].median().filter(|_| measured && rows > 1);
        let Some(plain) = plain else { return 1.0 + PRIOR_ROW_COST * rows.saturating_sub(1) as f64 };
        if let Some(t) = self.times[rows].median() {
            return t / plain;
        }
        let per_row: Vec<f64> = (2..self.times.len())
            .filter_map(|r| self.times[r].median().map(|t| (t / plain - 1.0) / (r - 1) as f64))
            .collect();
        let slope =
            if per_row.is_empty() { PRIOR_ROW_COST } else { per_row.iter().sum::<f64>() / per_row.len() as f64 };
        1.0 + slope.max(0.0) * (rows - 1) as f64
    }

    /// The draft length expected to gain most for a draft from an `n`-token match, at most
    /// `limit`, by the measured costs (or by the prior ones when `measured` is false); 0 when
    /// none is expected to gain [`MIN_GAIN`].
    fn best_length(&self, n: usize, limit: usize, measured: bool) -> usize {
        let mut best = (0, MIN_GAIN);
        for k in AUTO_LENGTHS.into_iter().filter(|&k| k <= limit) {
            let emitted = 1.0 + self.held[n - 1].expected_kept(k);
            let gain = emitted / self.cost(k + 1, measured);
            if gain >= best.1 {
                best = (k, gain);
            }
        }
        best.0
    }

    /// The draft length to verify now (0: decline): [`best_length`](Self::best_length), or,
    /// after [`PROBE_EVERY`] declines that the prior costs would not have made, a probe.
    fn choose(&mut self, n: usize, limit: usize) -> usize {
        let mut k = self.best_length(n, limit, true);
        if k == 0 && self.declined >= PROBE_EVERY {
            k = self.best_length(n, limit, false);
        }
        tracing::trace!(
            match_len = n,
            kept = ?AUTO_LENGTHS.map(|k| self.held[n - 1].expected_kept(k)),
            cost = ?AUTO_LENGTHS.map(|k| self.cost(k + 1, true)),
            chosen = k,
            "auto lookup draft"
        );
        if k == 0 {
            self.declined += 1;
        } else {
            self.declined = 0;
        }
        k
    }

    /// Checks a declined draft's first token against the model's, now in `context`.
    fn resolve_shadow(&mut self, context: &[u32]) {
        let Some((at, before, token, n)) = self.shadow else { return };
        if context.len() <= at {
            return;
        }
        self.shadow = None;
        // A context that no longer holds the token the draft followed went elsewhere (a
        // new prompt): nothing to learn.
        if context[at - 1] == before {
            self.held[n - 1].count(1, usize::from(context[at] == token));
        }
    }

    /// Takes the time of one step of a sequence alone: `rows` = 1 is a plain decode step,
    /// otherwise a verification of `rows − 1` drafts (with any recomputation it needed).
    fn record_time(&mut self, rows: usize, secs: f64) {
        self.times[rows.clamp(1, MAX_DRAFT + 1)].push(secs);
    }
}

/// Prompt-lookup drafting: `lookup` drafts with an adaptive draft length whenever the context
/// has a match; `auto` drafts only the lengths that are expected to pay ([`PayoffGate`]).
#[derive(Debug, Clone)]
pub struct LookupDrafter {
    mode: SpeculativeMode,
    /// Current draft length (`lookup`).
    k: usize,
    gate: PayoffGate,
    /// The match length of the last draft handed out.
    last_n: usize,
}

impl LookupDrafter {
    /// A drafter for `mode`.
    pub fn new(mode: SpeculativeMode) -> Self {
        LookupDrafter { mode, k: 4, gate: PayoffGate::new(), last_n: 1 }
    }

    /// A drafter for `mode` that starts from `other`'s step timings (they belong to the model
    /// and the machine, not to a conversation), for a session forked from `other`'s.
    pub fn with_timings_of(mode: SpeculativeMode, other: &LookupDrafter) -> Self {
        let mut d = LookupDrafter::new(mode);
        d.gate.times = other.gate.times;
        d
    }

    /// The mode.
    pub fn mode(&self) -> SpeculativeMode {
        self.mode
    }

    /// Drafts for the token after `context` (everything the model has seen plus the token
    /// just chosen), at most `limit` of them: what followed the latest earlier occurrence of
    /// the context's last 3 tokens (else 2, else 1). Empty when nothing matches, the mode is
    /// neither `lookup` nor `auto`, or `auto` expects no draft length to pay.
    pub fn draft(&mut self, context: &[u32], limit: usize) -> Vec<u32> {
        if limit == 0 {
            return Vec::new();
        }
        match self.mode {
            SpeculativeMode::Lookup => lookup(context, tile_aligned(self.k).min(limit)),
            SpeculativeMode::Auto => {
                self.gate.resolve_shadow(context);
                let Some((n, from)) = lookup_match(context) else { return Vec::new() };
                let k = self.gate.choose(n, limit);
                if k == 0 {
                    let first = read_on(context, from, 1)[0];
                    self.gate.shadow = Some((context.len(), context[context.len() - 1], first, n));
                    return Vec::new();
                }
                self.last_n = n;
                read_on(context, from, k)
            }
            SpeculativeMode::None | SpeculativeMode::Mtp => Vec::new(),
        }
    }

    /// Records a verification: `drafted` tokens proposed, the first `accepted` of them kept.
    /// `lookup`: all kept → four more next time; none kept → half as many. `auto`: counts
    /// them for the match length the draft came from.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if self.mode == SpeculativeMode::Auto {
            self.gate.held[self.last_n - 1].count(drafted, accepted);
            return;
        }
        if accepted == drafted {
            self.k = (self.k + 4).min(MAX_DRAFT);
        } else if accepted == 0 {
            self.k = (self.k / 2).max(1);
        } else {
            self.k = (accepted + 1).clamp(1, MAX_DRAFT);
        }
    }

    /// Records how long one step of this session took when it ran alone: `rows` = 1 for a
    /// plain decode step, else a verification of `rows − 1` lookup drafts (including the
    /// rerun of the kept tokens a hybrid model needs after a rejection). `auto` weighs the
    /// drafts' gain against these times.
    pub fn record_step_time(&mut self, rows: usize, secs: f64) {
        self.gate.record_time(rows, secs);
    }
}

/// Most tokens the MTP head drafts per step (the head is trained for one; each further
/// draft feeds its own output back, and acceptance falls with every one).
pub const MAX_MTP_DRAFT: usize = 4;
/// Below this share of MTP drafts accepted over a window, `auto` stops drafting for a while.
/// On the 4B shape (bench/RESULTS.md, "MTP verify cost, session 11") drafting breaks even at
/// a per-draft acceptance of about 0.5 with one draft and 0.62 / 0.68 / 0.71 with 2 / 3 / 4,
/// which is a share of accepted drafts of 0.50 / 0.50 / 0.48 / 0.46: above 0.55 every draft
/// length gains.
const MIN_MTP_ACCEPTANCE: f32 = 0.55;
/// Most hidden states waiting for the head (a prompt's latest; the earlier positions are a
/// gap in the head's context): 1024 rows of a 2560-wide model are 10 MB, held by every
/// session with the drafter on, the scheduler's too (which prefill through the session but do
/// not speculate).
const MAX_PENDING: usize = 1024;

/// Drafting with a model's multi-token-prediction head (docs/speculative.md, "MTP
/// drafting"). The head reads the main model's hidden state at position i with token i + 1;
/// the drafter keeps the head's own KV cache in step with the session: the hidden states of
/// every forward the session runs with them ([`MtpDrafter::observe`]) are fed to the head at
/// the next draft, and a rewind of the session cuts the head's cache back
/// ([`MtpDrafter::rewind`]). Positions whose hidden states were never seen (a plain decode
/// step, a restored session) leave a gap: the head then attends to fewer earlier positions,
/// which may cost acceptance but never exactness, since every draft is verified.
#[derive(Debug, Clone)]
pub struct MtpDrafter {
    mode: SpeculativeMode,
    /// The head's KV cache: one row per position whose pair (token i + 1, hidden i) it has
    /// seen.
    cache: Cache,
    /// The session position of each row of `cache`, increasing.
    rows_pos: Vec<usize>,
    /// Main-model hidden states not yet fed to the head, for positions `pending_from..`.
    pending: Vec<f32>,
    pending_from: usize,
    /// Hidden width.
    d: usize,
    /// Current draft length, 1..=[`MAX_MTP_DRAFT`].
    k: usize,
    gate: PauseGate,
}

impl MtpDrafter {
    /// A drafter for `head` in `mode` (`mtp` drafts every step; `auto` pauses while the
    /// drafts do not pay).
    pub fn new(head: &dyn MtpHead, mode: SpeculativeMode) -> Self {
        MtpDrafter {
            mode,
            cache: head.new_mtp_cache(),
            rows_pos: Vec::new(),
            pending: Vec::new(),
            pending_from: 0,
            d: head.hidden_size(),
            // One draft: the cheapest to be wrong about (break-even acceptance ~0.5 on the
            // 4B shape, where one draft also gains most up to an acceptance of ~0.8).
            k: 1,
            gate: PauseGate::new(MIN_MTP_ACCEPTANCE),
        }
    }

    /// Takes the main model's hidden states (after its final norm) for positions `from..`,
    /// from a forward the session ran. Rows that do not continue the ones waiting replace
    /// them.
    pub fn observe(&mut self, from: usize, hidden: &[f32]) {
        if hidden.is_empty() {
            return;
        }
        if self.pending_from + self.pending.len() / self.d != from {
            self.pending.clear();
            self.pending_from = from;
        }
        self.pending.extend_from_slice(hidden);
        // A long prompt's hidden states are not all kept: the head sees the latest ones.
        let rows = self.pending.len() / self.d;
        if rows > MAX_PENDING {
            self.pending.drain(..(rows - MAX_PENDING) * self.d);
            self.pending_from += rows - MAX_PENDING;
        }
    }

    /// The session went back to its first `len` tokens: forgets the head's rows whose next
    /// token is gone and the hidden states past the end.
    pub fn rewind(&mut self, len: usize) {
        let keep = self.rows_pos.partition_point(|&p| p + 1 < len);
        if keep < self.rows_pos.len() {
            self.rows_pos.truncate(keep);
            self.cache.truncate(keep).expect("an attention-only cache cuts back anywhere");
        }
        let rows = (len.saturating_sub(self.pending_from)).min(self.pending.len() / self.d);
        self.pending.truncate(rows * self.d);
    }

    /// True when the hidden state of the context's last position is at hand, so
    /// [`draft`](Self::draft) can run; otherwise the session needs one forward that returns
    /// hidden states first. `n` is the session's token count (the context without the token
    /// just chosen).
    pub fn ready(&self, n: usize) -> bool {
        !self.pending.is_empty() && self.pending_from + self.pending.len() / self.d == n
    }

    /// True when `auto` is pausing (the call counts as one plain token).
    pub fn paused(&mut self) -> bool {
        self.mode == SpeculativeMode::Auto && self.gate.paused()
    }

    /// Drafts for the token after `context` (the session's tokens plus the token just
    /// chosen), at most `limit`: the waiting hidden states go through the head with the
    /// tokens after them (the last pair being the chosen token with the last hidden state),
    /// the head's greedy pick is the first draft, and each further draft runs the head on the
    /// draft before it and the head's own output. The draft rows leave the head's cache
    /// again (the verified tokens come back as pairs with the main model's hidden states).
    /// Needs [`ready`](Self::ready).
    pub fn draft(&mut self, head: &dyn MtpHead, context: &[u32], limit: usize) -> Result<Vec<u32>, ModelError> {
        let n = context.len() - 1;
        let k = self.k.min(limit);
        if k == 0 || !self.ready(n) {
            return Ok(Vec::new());
        }
        let rows = self.pending.len() / self.d;
        let next: Vec<u32> = (self.pending_from..n).map(|p| context[p + 1]).collect();
        let (mut logits, hidden) = head.mtp_forward(&next, &self.pending, &mut self.cache, false)?;
        self.rows_pos.extend(self.pending_from..n);
        debug_assert_eq!(rows, next.len());
        self.pending.clear();
        self.pending_from = n;
        let committed = self.cache.pos;
        let mut out = hidden[(rows - 1) * self.d..].to_vec();
        let mut drafts = Vec::with_capacity(k);
        loop {
            let id = argmax(&logits);
            drafts.push(id);
            if drafts.len() == k {
                break;
            }
            (logits, out) = head.mtp_forward(&[id], &out, &mut self.cache, false)?;
        }
        self.cache.truncate(committed).expect("an attention-only cache cuts back anywhere");
        Ok(drafts)
    }

    /// Records a verification: `drafted` tokens proposed, the first `accepted` kept. All
    /// kept → one more next time (up to [`MAX_MTP_DRAFT`]); none → one fewer (down to 1);
    /// otherwise one more than were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        self.k = if accepted == drafted {
            (self.k + 1).min(MAX_MTP_DRAFT)
        } else if accepted == 0 {
            self.k.saturating_sub(1).max(1)
        } else {
            (accepted + 1).min(MAX_MTP_DRAFT)
        };
        if self.mode == SpeculativeMode::Auto && self.gate.record(drafted, accepted) {
            self.k = 1;
        }
    }

    /// Sets the draft length (1..=[`MAX_MTP_DRAFT`]; the benchmark fixes it).
    pub fn set_draft_len(&mut self, k: usize) {
        self.k = k.clamp(1, MAX_MTP_DRAFT);
    }
}

/// The first index of the largest value.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The draft length for a wish of `k`: from 3 on, one less than a multiple of 4, so the
/// verification's rows (the drafts and the token before them) fill the quantized kernels'
/// 4- and 8-row tiles instead of leaving a row for the one-row kernel (bench/RESULTS.md,
/// "Speculative decoding", has the cost per row count).
fn tile_aligned(k: usize) -> usize {
    if k >= 3 {
        (k + 1) / 4 * 4 - 1
    } else {
        k
    }
}

/// The `k` tokens that followed the latest earlier occurrence of `context`'s last n tokens
/// (n = 3, then 2, then 1), continued periodically past the end of the context; empty when
/// nothing matches.
pub fn lookup(context: &[u32], k: usize) -> Vec<u32> {
    match lookup_match(context) {
        Some((_, from)) => read_on(context, from, k),
        None => Vec::new(),
    }
}

/// The longest n (3, then 2, then 1) for which `context`'s last n tokens occurred earlier with
/// a token after them, and where the latest such occurrence's follower is.
fn lookup_match(context: &[u32]) -> Option<(usize, usize)> {
    let len = context.len();
    for n in (1..=MAX_NGRAM).rev() {
        if len <= n {
            continue;
        }
        let tail = &context[len - n..];
        // Latest start `s < len - n` whose n tokens equal the tail and that has a follower.
        if let Some(s) = (0..len - n).rev().find(|&s| &context[s..s + n] == tail) {
            return Some((n, s + n));
        }
    }
    None
}

/// `k` tokens of `context` from `from` on, read on into the draft itself where they reach the
/// end: a run that repeats with period p drafts its next k tokens, not only the ones already
/// seen.
fn read_on(context: &[u32], from: usize, k: usize) -> Vec<u32> {
    let len = context.len();
    let mut draft = Vec::with_capacity(k);
    for i in from..from + k {
        let next = if i < len { context[i] } else { draft[i - len] };
        draft.push(next);
    }
    draft
}

/// The token to emit at a drafted position, by the rejection rule of speculative sampling for
/// a deterministic draft (Leviathan et al. 2023, Chen et al. 2023, with the draft
/// distribution a point mass on `draft`): `draft` with probability p(draft), otherwise a draw
/// from p with `draft` removed and renormalised, so the result is distributed as p.
/// `candidates` are token ids and `weights` their (not necessarily normalised) probabilities;
/// `u1` and `u2` are independent uniforms in [0, 1).
pub fn pick_after_draft(candidates: &[u32], weights: &[f32], draft: u32, u1: f32, u2: f32) -> u32 {
    let total: f32 = weights.iter().sum();
    let w_draft: f32 = candidates.iter().zip(weights).filter(|(&c, _)| c == draft).map(|(_, &w)| w).sum();
    if total > 0.0 && u1 * total < w_draft {
        return draft;
    }
    let rest = total - w_draft;
    let mut u = u2 * rest;
    let mut last = None;
    for (&c, &w) in candidates.iter().zip(weights) {
        if c == draft || w <= 0.0 {
            continue;
        }
        if u < w {
            return c;
        }
        u -= w;
        last = Some(c);
    }
    // Rounding left `u` past the end (or nothing but the draft had weight).
    last.unwrap_or(draft)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn lookup_copies_what_followed_the_longest_latest_match() {
        // ... 7 8 9 [1 2 3] 4 5 ... then the context ends in 8 9 -> draft 1 2 3.
        let ctx = [5, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(lookup(&ctx, 3), vec![1, 2, 3]);
        // A match near the end reads on into its own draft: the period-2 run goes on.
        assert_eq!(lookup(&[1, 2, 1], 5), vec![2, 1, 2, 1, 2]);
        assert_eq!(lookup(&[4, 4, 4], 3), vec![4, 4, 4]);
        // A trigram match wins over a later bigram: the tail 1 2 3 appears at 0, while 2 3
        // alone appears later followed by 9.
        let ctx = [1, 2, 3, 4, 0, 2, 3, 9, 1, 2, 3];
        assert_eq!(lookup(&ctx, 2), vec![4, 0]);
        assert!(lookup(&[1, 2, 3], 4).is_empty());
    }

    #[test]
    fn modes_parse_and_unknown_ones_are_refused_with_the_choices() {
        assert_eq!("auto".parse(), Ok(SpeculativeMode::Auto));
        assert_eq!("lookup".parse(), Ok(SpeculativeMode::Lookup));
        assert_eq!("none".parse(), Ok(SpeculativeMode::None));
        assert_eq!("mtp".parse(), Ok(SpeculativeMode::Mtp));
        assert_eq!(SpeculativeMode::default(), SpeculativeMode::Auto);
        for m in [SpeculativeMode::None, SpeculativeMode::Lookup, SpeculativeMode::Mtp, SpeculativeMode::Auto] {
            assert_eq!(m.to_string().parse(), Ok(m));
        }
        let bad = "fast".parse::<SpeculativeMode>().unwrap_err();
        assert!(bad.contains("none, lookup, mtp or auto") && bad.contains("\"fast\""), "{bad}");
    }

    /// Times steps as a machine would: a plain step 10 ms, each extra row `per_row` seconds.
    fn timed(mode: SpeculativeMode, per_row: f64) -> LookupDrafter {
        let mut d = LookupDrafter::new(mode);
        for _ in 0..TIMINGS_TRUSTED {
            for rows in 1..=MAX_DRAFT + 1 {
                d.record_step_time(rows, 0.010 + per_row * (rows - 1) as f64);
            }
        }
        d
    }

    /// Counts as of many drafts whose every token held with probability `rate`.
    fn holding(rate: f32) -> [Survival; MAX_NGRAM] {
        [Survival { reached: [20.0; MAX_DRAFT], broke: [20.0 * (1.0 - rate); MAX_DRAFT] }; MAX_NGRAM]
    }

    #[test]
    fn survival_follows_where_drafts_break() {
        // Drafts of 7 that always keep 3: the fourth token is where they break.
        let mut s = Survival::EMPTY;
        for _ in 0..60 {
            s.count(7, 3);
        }
        let (k3, k7) = (s.expected_kept(3), s.expected_kept(7));
        assert!(k3 > 2.8 && k7 - k3 < 0.1, "{k3} {k7}");
        // Copied blocks: half the drafts break at once, the others hold all the way. A single
        // per-token rate would say each token holds 15 times in 16; position by position,
        // once the first held the rest are near certain.
        let mut s = Survival::EMPTY;
        for _ in 0..30 {
            s.count(15, 0);
            s.count(15, 15);
        }
        let first = s.expected_kept(1);
        assert!((0.45..0.55).contains(&first), "{first}");
        assert!(s.expected_kept(15) > 14.0 * first, "{}", s.expected_kept(15));
        // Nothing counted: even odds for the first token.
        assert!((Survival::EMPTY.expected_kept(1) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_slow_spell_of_the_machine_does_not_switch_auto_off_for_good() {
        let ctx: Vec<u32> = (0..40).map(|i| i % 20).collect();
        let mut d = timed(SpeculativeMode::Auto, 0.002);
        d.gate.held = holding(0.9);
        let k = d.draft(&ctx, 100).len();
        assert_eq!(k, 7, "1 + 0.9 + … + 0.9^7 = 5.7 tokens for 2.4 steps");
        // One verification slowed by other work: the median of the latest timings holds.
        d.record_step_time(k + 1, 1.0);
        assert_eq!(d.draft(&ctx, 100).len(), k);
        // A long slow spell: every verification timed at ten plain steps.
        for rows in 2..=MAX_DRAFT + 1 {
            for _ in 0..TIMINGS_KEPT {
                d.record_step_time(rows, 0.1);
            }
        }
        for _ in 0..PROBE_EVERY {
            assert!(d.draft(&ctx, 100).is_empty());
        }
        assert!(!d.draft(&ctx, 100).is_empty(), "a probe times the drafts again");
        assert!(d.draft(&ctx, 100).is_empty(), "and only one");
    }

    #[test]
    fn auto_stops_drafting_what_is_rejected_and_lookup_drafts_anyway() {
        let ctx = [1, 2, 1, 2, 1, 2, 1];
        // Untimed, at even odds: a short draft (the prior cost of a row is 0.3 of a step).
        assert_eq!(LookupDrafter::new(SpeculativeMode::Auto).draft(&ctx, 8).len(), 1);
        let mut auto = timed(SpeculativeMode::Auto, 0.004);
        let mut always = timed(SpeculativeMode::Lookup, 0.004);
        let mut verifications = 0;
        loop {
            let d = auto.draft(&ctx, 8);
            if d.is_empty() {
                break;
            }
            auto.record(d.len(), 0);
            verifications += 1;
            assert!(verifications < 5, "auto keeps drafting what is always rejected");
        }
        assert!(auto.draft(&ctx, 8).is_empty(), "auto stays off while nothing new is seen");
        for _ in 0..30 {
            let d = always.draft(&ctx, 8);
            assert!(!d.is_empty(), "lookup drafts whatever the acceptance");
            always.record(d.len(), 0);
        }
        assert!(LookupDrafter::new(SpeculativeMode::None).draft(&ctx, 8).is_empty());
    }

    #[test]
    fn auto_resumes_when_the_drafts_it_declined_would_have_held() {
        let mut auto = timed(SpeculativeMode::Auto, 0.004);
        // "1 2 3" occurred before, followed by 4: the context copies.
        let mut ctx: Vec<u32> = vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3];
        // Six rejections in a row.
        assert!(!auto.draft(&ctx, 8).is_empty());
        for _ in 0..6 {
            auto.record(1, 0);
        }
        assert!(auto.draft(&ctx, 8).is_empty());
        // The model now produces what the declined drafts said, one plain step at a time.
        let mut plain = 0;
        while auto.draft(&ctx, 8).is_empty() {
            ctx.push(lookup(&ctx, 1)[0]);
            plain += 1;
            assert!(plain < 20, "auto never noticed the reply copying again");
        }
        assert!(plain >= 2, "one held token is not enough evidence after rejections ({plain})");
        // A context that went elsewhere (a new prompt) teaches nothing.
        let mut fresh = timed(SpeculativeMode::Auto, 0.004);
        fresh.gate.held = holding(0.02);
        let before = fresh.gate.held;
        assert!(fresh.draft(&[1, 2, 3, 1, 2], 8).is_empty());
        assert!(fresh.draft(&[7, 8, 9, 7, 8, 4, 4], 8).is_empty());
        assert_eq!(fresh.gate.held, before);
    }

    #[test]
    fn auto_drafts_longer_the_cheaper_the_rows_and_the_surer_the_drafts() {
        let ctx: Vec<u32> = (0..40).map(|i| i % 20).collect();
        let mut cheap = timed(SpeculativeMode::Auto, 0.0005);
        for _ in 0..20 {
            let n = cheap.draft(&ctx, 100).len();
            assert!(n > 0);
            cheap.record(n, n);
        }
        assert_eq!(cheap.draft(&ctx, 100).len(), MAX_DRAFT);
        assert_eq!(cheap.draft(&ctx, 2).len(), 2, "the caller's limit");
        // Drafts that hold 4 times in 5, rows at 0.3 of a step each: three drafts (1 + 0.8 +
        // 0.64 + 0.51 tokens for 1.9 steps) beat one (1.8 for 1.3) and seven (4.16 for 3.1).
        let mut dear = timed(SpeculativeMode::Auto, 0.003);
        dear.gate.held = holding(0.8);
        assert_eq!(dear.draft(&ctx, 100).len(), 3);
        // Where each extra row costs a whole step, no verification can pay.
        let mut flat = timed(SpeculativeMode::Auto, 0.010);
        flat.gate.held = cheap.gate.held;
        assert!(flat.draft(&ctx, 100).is_empty());
        // A session forked from `flat` keeps its timings (they are the machine's).
        let mut fork = LookupDrafter::with_timings_of(SpeculativeMode::Auto, &flat);
        fork.gate.held = cheap.gate.held;
        assert!(fork.draft(&ctx, 100).is_empty());
    }

    #[test]
    fn draft_length_follows_acceptance() {
        let mut d = LookupDrafter::new(SpeculativeMode::Lookup);
        let ctx: Vec<u32> = (0..40).map(|i| i % 20).collect();
        // k = 4 wished, 3 drafted: four rows with the token before them.
        assert_eq!(d.draft(&ctx, 100).len(), 3);
        d.record(3, 3);
        assert_eq!(d.draft(&ctx, 100).len(), 7);
        d.record(7, 7);
        d.record(7, 7);
        assert_eq!(d.draft(&ctx, 100).len(), MAX_DRAFT);
        d.record(15, 0);
        assert_eq!(d.draft(&ctx, 100).len(), 7);
        d.record(7, 1);
        assert_eq!(d.draft(&ctx, 100).len(), 2);
        assert_eq!(d.draft(&ctx, 1).len(), 1, "the caller's limit");
    }

    /// The rejection rule leaves the distribution unchanged: 200 000 picks after a fixed
    /// draft, against p, by Pearson's chi-square (4 degrees of freedom; 18.47 is the 0.1 %
    /// critical value, so a correct rule fails one seed in a thousand — the seeds are fixed).
    #[test]
    fn picks_after_a_point_mass_draft_follow_the_target_distribution() {
        let candidates = [3u32, 0, 4, 1, 2];
        let weights = [0.05f32, 0.4, 0.25, 0.2, 0.1];
        let n = 200_000;
        for (draft, seed) in [(0u32, 1u64), (2, 2), (3, 3), (7, 4)] {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut counts = [0usize; 5];
            for _ in 0..n {
                let id = pick_after_draft(&candidates, &weights, draft, rng.random(), rng.random());
                counts[id as usize] += 1;
            }
            let chi2: f64 = candidates
                .iter()
                .zip(&weights)
                .map(|(&c, &w)| {
                    let expected = w as f64 * n as f64;
                    (counts[c as usize] as f64 - expected).powi(2) / expected
                })
                .sum();
            assert!(chi2 < 18.47, "draft {draft}: chi-square {chi2:.2} over {counts:?}");
        }
        // The naive rule (keep the draft if it is possible at all) is caught by the same test.
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let kept = (0..n)
            .filter(|_| {
                let (u1, u2): (f32, f32) = (rng.random(), rng.random());
                pick_after_draft(&candidates, &weights, 0, u1, u2) == 0
            })
            .count();
        let share = kept as f64 / n as f64;
        assert!((share - 0.4).abs() < 0.01, "the draft is kept with its probability, found {share}");
    }
}

#[cfg(test)]
mod mtp_tests {
    use super::*;
    use frognano_model::qwen35::Qwen35;
    use frognano_model::CausalLm;

    fn tiny() -> Qwen35 {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/qwen35-tiny");
        Qwen35::from_safetensors(&dir).unwrap()
    }

    /// The drafter's bookkeeping: hidden states wait until a draft feeds them to the head with
    /// the tokens after them, rows that do not continue the waiting ones replace them, the
    /// draft rows leave the head's cache, and a rewind drops the rows whose next token is gone.
    #[test]
    fn mtp_drafter_keeps_the_heads_cache_in_step_with_the_session() {
        let m = tiny();
        let head = m.mtp().unwrap();
        let d = head.hidden_size();
        let ids: Vec<u32> = (0..12).map(|i| 5 + 3 * i).collect();
        let mut cache = m.new_cache();
        let (_, hidden) = head.forward_with_hidden(&ids[..10], &mut cache, false).unwrap();
        let mut drafter = MtpDrafter::new(head, SpeculativeMode::Mtp);
        assert!(!drafter.ready(10));
        drafter.observe(0, &hidden);
        assert!(drafter.ready(10) && !drafter.ready(9) && !drafter.ready(11));
        drafter.set_draft_len(3);
        // Context: the 10 tokens run plus the one just chosen.
        let drafts = drafter.draft(head, &ids[..11], 8).unwrap();
        assert_eq!(drafts.len(), 3);
        assert_eq!(drafter.cache.pos, 10, "ten true pairs stay; the two draft rows are cut");
        assert_eq!(drafter.rows_pos, (0..10).collect::<Vec<_>>());
        assert!(!drafter.ready(11), "the next draft needs the verification's hidden states");
        // A draft of the same context again (from a fresh drafter) gives the same tokens: the
        // draft rows left nothing behind.
        let mut again = MtpDrafter::new(head, SpeculativeMode::Mtp);
        again.observe(0, &hidden);
        again.set_draft_len(3);
        assert_eq!(again.draft(head, &ids[..11], 8).unwrap(), drafts);
        // The limit caps the drafts.
        let mut one = MtpDrafter::new(head, SpeculativeMode::Mtp);
        one.observe(0, &hidden);
        one.set_draft_len(4);
        assert_eq!(one.draft(head, &ids[..11], 1).unwrap().len(), 1);
        // Rows not continuing the waiting ones replace them.
        drafter.observe(12, &hidden[..d]);
        assert!(drafter.ready(13));
        drafter.observe(10, &hidden[..2 * d]);
        assert!(drafter.ready(12) && !drafter.ready(13));
        // Back to 5 tokens: pairs 0..=3 (their next tokens 1..=4 remain) stay.
        drafter.rewind(5);
        assert_eq!(drafter.cache.pos, 4);
        assert_eq!(drafter.rows_pos, vec![0, 1, 2, 3]);
        assert!(!drafter.ready(12), "the waiting rows were past the end");
        drafter.rewind(0);
        assert_eq!(drafter.cache.pos, 0);
    }

    #[test]
    fn mtp_draft_length_follows_acceptance_and_auto_pauses() {
        let m = tiny();
        let mut d = MtpDrafter::new(m.mtp().unwrap(), SpeculativeMode::Auto);
        assert_eq!(d.k, 1);
        d.record(1, 1);
        d.record(2, 2);
        d.record(3, 3);
        d.record(4, 4);
        assert_eq!(d.k, MAX_MTP_DRAFT);
        d.record(4, 1);
        assert_eq!(d.k, 2);
        d.record(2, 0);
        assert_eq!(d.k, 1);
        // A window of mostly rejected drafts pauses `auto`; `mtp` never pauses.
        let mut mtp = MtpDrafter::new(m.mtp().unwrap(), SpeculativeMode::Mtp);
        for _ in 0..WINDOW {
            d.record(1, 0);
            mtp.record(1, 0);
        }
        assert!(d.paused());
        assert!(!mtp.paused());
    }
}
