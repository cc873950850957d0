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
