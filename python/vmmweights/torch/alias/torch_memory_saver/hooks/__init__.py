"""torch_memory_saver.hooks: the two hook modes."""
