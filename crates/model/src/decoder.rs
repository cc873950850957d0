//! What every architecture's [`CausalLm`] does around its layer stack: check the input, run
//! the stack over per-sequence segments, apply the head. An architecture supplies the
//! [`LayerStack`]; [`forward`] (one sequence, any number of new tokens) and [`forward_batch`]
//! (one new token for each of several sequences) are the same segment-batched pass, so a
//! prefill and a batched decode step read every weight once.

use crate::cache::Cache;
use crate::error::{ModelError, Result};
use crate::CausalLm;

/// An architecture's decoder stack, as [`forward`] and [`forward_batch`] drive it.
pub(crate) trait LayerStack: CausalLm {
    /// Model width.
    fn hidden_size(&self) -> usize;

    /// True when `cache` has this model's layer layout.
    fn fits(&self, cache: &Cache) -> bool;

    /// The decoder stack over `ids`, split into per-sequence segments: `segs[i] = (rows,
    /// cache)` takes the next `rows` ids at that cache's positions. Norms, projections and
    /// MLPs run over the rows of all segments together; attention and recurrent steps per
    /// segment. Returns the last hidden states `[ids.len(), d]` and advances every cache. Ids
    /// and cache layouts have been checked. For a segment that `rows` takes stepwise, the
    /// attention and recurrent steps take its rows one at a time, through the one-token
    /// kernels a decode step uses (the row-wise norms and matmuls give those bits for any
    /// number of rows), so each row's result is the bits a decode step of that token alone
    /// gives ([`forward_stepwise`]); the others run in a prompt's order.
    fn decode_layers(&self, ids: &[u32], segs: &mut [(usize, &mut Cache)], rows: Rows) -> Vec<f32>;

    /// Final norm and output head over `n` hidden rows: `[n, vocab]`.
    fn logits(&self, rows: &[f32], n: usize) -> Vec<f32>;
}

/// How a pass of the layer stack ([`LayerStack::decode_layers`]) takes each segment's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rows {
    /// Every segment in a prompt's order (a prefill; a decode step's one-row segments).
    Prompt,
    /// Every segment's rows one at a time, as decode steps take them.
    Stepwise,
    /// Every segment stepwise but the last, a prompt's piece ([`forward_batch_stepwise_and_prompt`]).
    StepwiseThenPrompt,
}

impl Rows {
    /// Whether segment `i` of `n` goes stepwise.
    pub(crate) fn stepwise(self, i: usize, n: usize) -> bool {
        match self {
            Rows::Prompt => false,
            Rows::Stepwise => true,
            Rows::StepwiseThenPrompt => i + 1 < n,
        }
    }
}

/// Fails unless every cache has the model's layer layout.
fn check_caches<'c, M: LayerStack>(m: &M, caches: impl IntoIterator<Item = &'c Cache>) -> Result<()> {
    match caches.into_iter().all(|c| m.fits(c)) {
        true => Ok(()),
        false => Err(ModelError::Input("cache belongs to a different model".into())),
    }
}

/// The most tokens one pass of the layer stack takes in [`CausalLm::forward`]: a longer
/// prompt goes through in pieces of this many, one after the other on the same cache, as
/// llama.cpp's micro-batches (`n_ubatch`, 512 by default) do. A pass holds several activation
/// rows per token (the MLP's gate and up rows are the widest: 2 · 9,216 floats a token for
/// Qwen3.5-4B), so in one pass a 32K-token prompt of the 4B shape was seen at 8.4 GB of RSS
/// (4.6 GB beyond its weights and cache) and a 131K-token one would have needed four times
/// that; in pieces they stay at one piece's worth (tens of MB) at any length. A multiple of the DeltaNet chunk (64) and of the tiled attention's
/// query tile (32); the pieces' matmuls still read each weight once per 512 rows.
pub const PROMPT_PIECE: usize = 512;

/// [`CausalLm::forward`] of a layer stack, on the calling thread, in pieces of at most
/// [`PROMPT_PIECE`] tokens.
pub(crate) fn forward<M: LayerStack>(m: &M, ids: &[u32], cache: &mut Cache, all_logits: bool) -> Result<Vec<f32>> {
    let (d, t, vocab) = (m.hidden_size(), ids.len(), m.vocab_size());
    crate::check_ids(ids, vocab)?;
    check_caches(m, [&*cache])?;
    let mut logits = Vec::with_capacity(if all_logits { t * vocab } else { 0 });
    let pieces = t.div_ceil(PROMPT_PIECE);
    for (i, piece) in ids.chunks(PROMPT_PIECE).enumerate() {
        let n = piece.len();
        let h = m.decode_layers(piece, &mut [(n, &mut *cache)], Rows::Prompt);
        if all_logits {
            logits.extend(m.logits(&h, n));
        } else if i + 1 == pieces {
            logits = m.logits(&h[(n - 1) * d..], 1);
        }
    }
    Ok(logits)
}

/// [`CausalLm::forward_stepwise`] of a layer stack, on the calling thread: every row's
/// logits, each the bits [`forward_batch`] gives that token fed alone after the ones before it.
pub(crate) fn forward_stepwise<M: LayerStack>(m: &M, ids: &[u32], cache: &mut Cache) -> Result<Vec<f32>> {
    crate::check_ids(ids, m.vocab_size())?;
    check_caches(m, [&*cache])?;
    let h = m.decode_layers(ids, &mut [(ids.len(), cache)], Rows::Stepwise);
    Ok(m.logits(&h, ids.len()))
}

/// [`CausalLm::forward_batch_stepwise`] of a layer stack, on the calling thread: one pass over
/// every segment's rows, each row's logits the bits of a decode step of that token alone.
pub(crate) fn forward_batch_stepwise<M: LayerStack>(
    m: &M,
    batch: &mut [(&[u32], &mut Cache)],
) -> Result<Vec<Vec<f32>>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let vocab = m.vocab_size();
    crate::check_segment_ids(batch, vocab)?;
    check_caches(m, batch.iter().map(|(_, c)| &**c))?;
    let ids: Vec<u32> = batch.iter().flat_map(|(ids, _)| ids.iter().copied()).collect();
    let mut segs: Vec<(usize, &mut Cache)> = batch.iter_mut().map(|(ids, c)| (ids.len(), &mut **c)).collect();
    let h = m.decode_layers(&ids, &mut segs, Rows::Stepwise);
    Ok(per_segment(&m.logits(&h, ids.len()), batch, vocab))
}

/// `logits` (`[Σ ids, vocab]`) cut into each segment's rows.
fn per_segment(logits: &[f32], batch: &[(&[u32], &mut Cache)], vocab: usize) -> Vec<Vec<f32>> {
    let mut rest = logits;
    let mut out = Vec::with_capacity(batch.len());
    for (ids, _) in batch {
        let (mine, tail) = rest.split_at(ids.len() * vocab);
        out.push(mine.to_vec());
        rest = tail;
    }
    out
}

/// [`CausalLm::forward_batch`] of a layer stack, on the calling thread.
pub(crate) fn forward_batch<M: LayerStack>(m: &M, batch: &mut [(u32, &mut Cache)]) -> Result<Vec<Vec<f32>>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    crate::check_batch_ids(batch, m.vocab_size())?;
    check_caches(m, batch.iter().map(|(_, c)| &**c))?;
    let ids: Vec<u32> = batch.iter().map(|(id, _)| *id).collect();
    let mut segs: Vec<(usize, &mut Cache)> = batch.iter_mut().map(|(_, c)| (1, &mut **c)).collect();
    let h = m.decode_layers(&ids, &mut segs, Rows::Prompt);
    let logits = m.logits(&h, ids.len());
    Ok(logits.chunks_exact(m.vocab_size()).map(<[f32]>::to_vec).collect())
}

/// [`CausalLm::forward_batch_stepwise_and_prompt`] of a layer stack, on the calling thread:
/// the batch's segments (stepwise) and the prompt piece (one segment in a prompt's order) in
/// one pass of the stack, the head over the segments' rows and the piece's last row. Norms,
/// matmuls and the head are row-wise and attention and the recurrent steps run per segment,
/// so every result has the bits of [`forward_batch_stepwise`] and [`forward`] apart. A piece
/// longer than [`PROMPT_PIECE`] runs apart (a pass holds activations for all its rows).
pub(crate) fn forward_batch_stepwise_and_prompt<M: LayerStack>(
    m: &M,
    batch: &mut [(&[u32], &mut Cache)],
    prompt: (&[u32], &mut Cache),
) -> Result<(Vec<Vec<f32>>, Vec<f32>)> {
    let (ids, cache) = prompt;
    let (d, vocab) = (m.hidden_size(), m.vocab_size());
    crate::check_segment_ids(batch, vocab)?;
    crate::check_ids(ids, vocab)?;
    check_caches(m, batch.iter().map(|(_, c)| &**c).chain([&*cache]))?;
    if batch.is_empty() || ids.len() > PROMPT_PIECE {
        let rows = forward_batch_stepwise(m, batch)?;
        return Ok((rows, forward(m, ids, cache, false)?));
    }
    let (all, mut segs) = segments_then_prompt(batch, (ids, cache));
    let stepwise_rows = all.len() - ids.len();
    let h = m.decode_layers(&all, &mut segs, Rows::StepwiseThenPrompt);
    let mut logits = m.logits(&rows_for_head(&h, stepwise_rows, d), stepwise_rows + 1);
    let prompt_logits = logits.split_off(stepwise_rows * vocab);
    Ok((per_segment(&logits, batch, vocab), prompt_logits))
}

/// The ids of `batch`'s segments and then `prompt`'s in one run, and the segments of a
/// [`Rows::StepwiseThenPrompt`] pass over them (the prompt's last).
pub(crate) fn segments_then_prompt<'a>(
    batch: &'a mut [(&[u32], &mut Cache)],
    prompt: (&[u32], &'a mut Cache),
) -> (Vec<u32>, Vec<(usize, &'a mut Cache)>) {
    let (ids, cache) = prompt;
    let all = batch.iter().flat_map(|(ids, _)| ids.iter().copied()).chain(ids.iter().copied()).collect();
    let mut segs: Vec<(usize, &mut Cache)> = batch.iter_mut().map(|(ids, c)| (ids.len(), &mut **c)).collect();
    segs.push((ids.len(), cache));
    (all, segs)
}

/// The rows of such a pass (`[rows, d]` hidden states) that go through the head: the
/// segments' `stepwise_rows`, then the prompt's last row only.
pub(crate) fn rows_for_head(h: &[f32], stepwise_rows: usize, d: usize) -> Vec<f32> {
    let mut rows = h[..stepwise_rows * d].to_vec();
    rows.extend_from_slice(&h[h.len() - d..]);
    rows
}
