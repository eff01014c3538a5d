"""The device-to-device copy rate, the ceiling the device collectives are held against: a 1 GiB
copy 20 times after 3 warm-ups, timed with CUDA events; GB/s counts bytes read and written."""
import torch

n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda")
b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = []
for _ in range(20):
    start.record()
    b.copy_(a)
    end.record()
    end.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
times.sort()
t = times[len(times) // 2]
print(f"d2d copy of 1 GiB: median {t * 1e3:.3f} ms, {2 * n / t / 1e9:.0f} GB/s read+written "
      f"(best {2 * n / times[0] / 1e9:.0f})", flush=True)
