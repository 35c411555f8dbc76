//! One tensor of a checkpoint, whatever its format: where its bytes are in
//! which shard file, its element type and its row-major shape.

use super::dtype::Dtype;

/// One tensor of a checkpoint: where its bytes are and what they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name in the checkpoint.
    pub name: String,
    /// Index into [`Checkpoint::shards`](super::Checkpoint::shards).
    pub shard: usize,
    /// Element type.
    pub dtype: Dtype,
    /// Shape (row-major: the last dimension is the fastest; for GGUF
    /// tensors, the file's `ne` reversed).
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the shard file.
    pub offset: u64,
    /// Bytes of data.
    pub len: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The dimensions in ggml's order (`ne[0]` the fastest): the shape reversed.
    pub fn ggml_ne(&self) -> Vec<usize> {
        self.shape.iter().rev().copied().collect()
    }
}
