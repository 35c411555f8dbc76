GiB_bytes = 1 << 30
