"""Experiment: per-machine calibration with separate factors for decode-only and prefill-carrying steps."""
import sys, json, types
sys.path.insert(0, "/work/main")
from simulator.cost_model import load_cost_model
from simulator.model_base import TimedModel
from simulator.intake import fit_intake_delay
from simulator.fidelity_table import run_row, pair_row, markdown, sign_table
from traces.log import read_log
from traces.events import Step

def factors(model, logs):
    sums = {"d": [0.0, 0.0], "p": [0.0, 0.0]}
    for log in logs:
        for ev in read_log(log):
            if isinstance(ev, Step):
                k = "p" if any(s.num_tokens != 1 for s in ev.spans) else "d"
                sums[k][0] += ev.end - ev.start; sums[k][1] += model.step_time(ev.step, ev.spans)
    return {k: live / pred for k, (live, pred) in sums.items()}

def scaled(fd, fp, intake=None):
    m = load_cost_model("qwen3-0.6b-h200")
    dt, st = m.decode_time, m.step_time
    m.decode_time = lambda n, c, l: fd * dt(n, c, l)
    m.decode_durations = types.MethodType(TimedModel.decode_durations, m)
    m.step_time = lambda step, spans: st(step, spans) * (fp if any(s.num_tokens != 1 for s in spans) else fd)
    if intake is not None:
        m.intake_delay = intake
    return m

I = "/work/h200logs/s7/I"
C1, C2, C3 = f"{I}/call1", f"{I}/call2", f"{I}/call3"
cal = [f"{C1}/conv_serve_on_0.6.jsonl.gz", f"{C3}/code_serve_on_0.6.jsonl.gz"]
f = factors(load_cost_model("qwen3-0.6b-h200"), cal)
print("factors", f)
m = scaled(f["d"], f["p"])
intake = fit_intake_delay(m, cal)
print("intake", intake["intake_delay_s"])
rows = []
mk = lambda: scaled(f["d"], f["p"], intake["intake_delay_s"])
for role, log in [("fit", cal[0]), ("fit", cal[1]), ("held-out", f"{C1}/conv_serve_on_0.9.jsonl.gz"),
                  ("held-out", f"{C2}/conv_serve_off_0.9.jsonl.gz"), ("held-out", f"{C3}/code_serve_off_0.6.jsonl.gz")]:
    rows.append(run_row(log, mk(), role))
rows.append(pair_row(f"{C1}/conv_serve_on_0.9.jsonl.gz", f"{C2}/conv_serve_off_0.9.jsonl.gz", mk(), "held-out"))
rows.append(pair_row(cal[1], f"{C3}/code_serve_off_0.6.jsonl.gz", mk(), "held-out"))
print(markdown(rows)); print(sign_table(rows))
