"""Per-step residuals of a model on live logs, binned by step kind."""
import sys, collections, numpy as np
sys.path.insert(0, "/work/main")
from traces.log import read_log
from traces.events import Step, Header
from simulator.cost_model import load_cost_model
from traces.decode_splits import DecodeSplits
model = load_cost_model(sys.argv[1])
for path in sys.argv[2:]:
    steps = []; hdr = None
    for ev in read_log(path):
        if isinstance(ev, Header): hdr = ev
        elif isinstance(ev, Step): steps.append(ev)
    bins = collections.defaultdict(list)
    for s in steps:
        pt = sum(x.num_tokens for x in s.spans if x.num_tokens > 1)
        nd = sum(1 for x in s.spans if x.num_tokens == 1)
        live = s.end - s.start
        pred = model.step_time(s.step, s.spans)
        if pt == 0:
            k = f"decode n={min(256, 1 << (max(nd,1)-1).bit_length()):>3}"
        else:
            k = f"prefill {'<=512' if pt <= 512 else '<=2048' if pt <= 2048 else '<=8192' if pt<=8192 else '>8192'} d={'0' if nd == 0 else '1-16' if nd <= 16 else '17-64' if nd <= 64 else '>64'}"
        bins[k].append((live, pred))
    print(f"== {path.split('/')[-1]}  steps {len(steps)}  live {sum(s.end-s.start for s in steps):.2f}s")
    for k in sorted(bins):
        v = np.array(bins[k]); l, p = v[:, 0].sum(), v[:, 1].sum()
        print(f"  {k:<24} {len(v):>6}  live {l:8.3f}s  model {p:8.3f}s  {100*(p-l)/l:+6.1f}%   mean live {1e3*l/len(v):6.2f} ms")
