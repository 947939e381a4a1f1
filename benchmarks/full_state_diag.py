"""Which part of joint shrinking costs quality (docs/benchmarks.md, "The full training state").

The training of benchmarks/full_state.py with its 5 resumes, but the store taken out: after every
interval the weights' residual against the previous "commit" is pruned in memory (Fisher rule,
5 %, no quantization), and at each resume the model and AdamW's moments are replaced by the
pruned weights and/or moments (ExCP's joint rule, mean or zero fill). One line per variant.

Usage::

    .venv/bin/python benchmarks/full_state_diag.py      # 7 variants, about 8 minutes on 2 cores
"""
import os, sys, time
import numpy as np, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import full_state as fs
from ckptstore.policy.shrink import fisher_threshold, shrink_moments
torch.set_num_threads(2)
template = fs.load_pretrained(); data = fs.load_data()
sched = fs.Schedule(10, 20, 1e-4)
at = set(fs.resume_after(10, 5))

def factored(v, keep):
    """Adafactor's rank-1 estimate of v where pruned."""
    if v.ndim != 2:
        return np.where(keep, v, v[~keep].mean() if (~keep).any() else 0)
    r = v.sum(1, keepdims=True); c = v.sum(0, keepdims=True); s = v.sum()
    est = (r * c / s) if s > 0 else np.zeros_like(v)
    return np.where(keep, v, est.astype(v.dtype))

def run(name, wmode, mmode, keep=0.05, seed=0):
    t0 = time.time()
    model = fs.build_model(template, seed); opt = fs.make_optimizer(model, sched.lr)
    params = [p for p in model.parameters()]
    recon = [p.detach().numpy().copy() for p in params]
    for i in range(1, 11):
        fs.train_interval(model, opt, data, seed, i, sched)
        st = opt.state_dict()["state"]
        w = [p.detach().numpy() for p in params]
        res = [wi - ri for wi, ri in zip(w, recon)]
        vs = [st[k]["exp_avg_sq"].numpy() if k in st else np.zeros_like(res[k]) for k in range(len(params))]
        cut = fisher_threshold(list(zip(res, vs)), keep)
        masks = [v * r * r > cut for r, v in zip(res, vs)]
        if wmode == "pruned":
            recon = [ri + np.where(mk, r, 0) for ri, r, mk in zip(recon, res, masks)]
        else:
            recon = [wi.copy() for wi in w]
        if i in at:
            sd = opt.state_dict()
            for k in sd["state"]:
                m = sd["state"][k]["exp_avg"].numpy(); v = sd["state"][k]["exp_avg_sq"].numpy()
                mk = masks[k]
                m2, vm = shrink_moments(m, v, mk, 2.0, "mean")
                _, vz = shrink_moments(m, v, mk, 2.0, "zero")
                kept = m2 != 0
                if mmode == "exact": nm, nv = m, v
                elif mmode == "excp-mean": nm, nv = m2, vm
                elif mmode == "excp-zero": nm, nv = m2, vz
                elif mmode == "m-only": nm, nv = m2, v
                elif mmode == "v-only": nm, nv = m, vm
                elif mmode == "factored": nm, nv = m2, factored(v, kept)
                sd["state"][k]["exp_avg"] = torch.from_numpy(np.ascontiguousarray(nm))
                sd["state"][k]["exp_avg_sq"] = torch.from_numpy(np.ascontiguousarray(nv))
            model = fs.build_model(template, seed + 1)
            with torch.no_grad():
                for p, r in zip(model.parameters(), recon): p.copy_(torch.from_numpy(r))
            opt = fs.make_optimizer(model, sched.lr); opt.load_state_dict(sd)
            params = [p for p in model.parameters()]
    acc, loss, _ = fs.evaluate(model, data)
    print(f"{name:40s} acc {acc:.4f} loss {loss:.4f}  {time.time()-t0:.0f}s", flush=True)

for name, w, m in [("ref-sim (exact, exact)", "exact", "exact"),
                   ("w pruned 5%, moments exact", "pruned", "exact"),
                   ("w exact, moments excp fill mean", "exact", "excp-mean"),
                   ("w exact, moments excp fill zero", "exact", "excp-zero"),
                   ("w exact, m pruned, v exact", "exact", "m-only"),
                   ("w exact, m exact, v pruned fill mean", "exact", "v-only"),
                   ("w exact, m pruned, v factored fill", "exact", "factored")]:
    run(name, w, m)
