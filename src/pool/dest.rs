//! The pool as the loader's destination allocator: parameters the loader
//! allocates from a plan come from the pool, in the calling thread's tag.

use super::Pool;
use crate::driver::DevicePtr;
use crate::error::Result;
use crate::loader::DestAllocator;

impl DestAllocator for Pool {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        // The pool aligns every block to at least 512 bytes.
        Ok(Pool::alloc(self, bytes)?.ptr)
    }
}
