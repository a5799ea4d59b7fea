"""The KV cache of a test's engine where the default size is not what it tests: room for a few
requests' whole contexts (cpu_kv_cache_requests), not max_num_seqs' as the default has. A
memory-sized default touches its first 1 GiB at start (lab.attention.base.prefault): up to 3
CPU-seconds for a tiny model on fresh memory, for requests that use a few blocks."""

SMALL_KV = {"cpu_kv_cache_requests": 4}
