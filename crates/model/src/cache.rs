//! Per-sequence model state. Full-attention layers keep keys and values; Gated DeltaNet
//! layers keep the last `K-1` pre-conv inputs and the `[Hv, dk, dv]` recurrent state (f32).
//! The whole cache is a plain value: cloning it is a snapshot, which is how the engine
//! reuses a conversation prefix on a hybrid model where nothing can be "cropped".

/// State of one layer.
#[derive(Debug, Clone)]
pub enum LayerCache {
    /// Keys and values after norm and RoPE, `[len, heads * head_dim]` each, appended.
    Attention {
        /// Keys, row per position.
        k: Vec<f32>,
        /// Values, row per position.
        v: Vec<f32>,
    },
    /// Gated DeltaNet state.
    Linear {
        /// Last `K-1` pre-conv inputs, `[K-1, conv_dim]`, oldest first (zeros at start).
        conv: Vec<f32>,
        /// Recurrent state `S`, `[Hv, dk, dv]`.
        state: Vec<f32>,
    },
}

/// A point in a cache's history that it can return to (see [`Cache::snapshot`]).
#[derive(Debug, Clone)]
pub struct CacheSnapshot {
    /// Tokens processed at the snapshot.
    pub pos: usize,
    /// Per layer: conv and recurrent state of linear layers, `None` for attention layers.
    linear: Vec<Option<(Vec<f32>, Vec<f32>)>>,
}

impl CacheSnapshot {
    /// Bytes this snapshot holds.
    pub fn byte_len(&self) -> usize {
        self.linear.iter().flatten().map(|(c, s)| (c.len() + s.len()) * 4).sum()
    }
}

/// The state of one sequence across all layers.
#[derive(Debug, Clone)]
pub struct Cache {
    /// One entry per layer.
    pub layers: Vec<LayerCache>,
    /// Tokens already processed (the position of the next token).
    pub pos: usize,
}

impl Cache {
    /// Tokens processed so far.
    pub fn len(&self) -> usize {
        self.pos
    }
    /// True when nothing has been processed.
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
    /// A snapshot to come back to later: the position plus a copy of every recurrent
    /// state. Keys and values are append-only, so they are not copied; restoring truncates
    /// them.
    pub fn snapshot(&self) -> CacheSnapshot {
        let linear = self
            .layers
            .iter()
            .map(|l| match l {
                LayerCache::Linear { conv, state } => Some((conv.clone(), state.clone())),
                LayerCache::Attention { .. } => None,
            })
            .collect();
        CacheSnapshot { pos: self.pos, linear }
    }

    /// Returns to `snap`, taken earlier from this cache (and not from beyond a later restore
    /// to an earlier point). Fails if the cache no longer holds that many positions.
    pub fn restore(&mut self, snap: &CacheSnapshot) -> Result<(), String> {
        if snap.pos > self.pos || snap.linear.len() != self.layers.len() {
            return Err(format!("snapshot at {} does not belong to this cache (at {})", snap.pos, self.pos));
        }
        let pos = self.pos;
        for (l, s) in self.layers.iter_mut().zip(&snap.linear) {
            match (l, s) {
                (LayerCache::Attention { k, v }, None) => {
                    let keep = |x: &mut Vec<f32>| {
                        let width = x.len().checked_div(pos).unwrap_or(0);
                        x.truncate(snap.pos * width);
                    };
                    keep(k);
                    keep(v);
                }
                (LayerCache::Linear { conv, state }, Some((c, st))) => {
                    conv.clone_from(c);
                    state.clone_from(st);
                }
                _ => return Err("snapshot layout does not match the cache".into()),
            }
        }
        self.pos = snap.pos;
        Ok(())
    }

    /// True when every layer can be rewound to any earlier position without a snapshot
    /// (pure attention models).
    pub fn is_rewindable(&self) -> bool {
        self.layers.iter().all(|l| matches!(l, LayerCache::Attention { .. }))
    }

    /// Rewinds an attention-only cache to `pos` tokens.
    pub fn truncate(&mut self, pos: usize) -> Result<(), String> {
        if !self.is_rewindable() {
            return Err("a cache with recurrent (linear-attention) state can only return to a snapshot".into());
        }
        let snap = CacheSnapshot { pos: pos.min(self.pos), linear: vec![None; self.layers.len()] };
        self.restore(&snap)
    }

    /// Bytes of state held (for memory reports).
    pub fn byte_len(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Attention { k, v } => (k.len() + v.len()) * 4,
                LayerCache::Linear { conv, state } => (conv.len() + state.len()) * 4,
            })
            .sum()
    }
}
