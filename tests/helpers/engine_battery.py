"""One rank of a job that checks hvdrunner.hvd_torch against numpy and Horovod's rules.

Run on N ranks by tests/test_hvd_torch.py (under torchrun's environment, with horovod made
unimportable); each rank writes ``OUT/rank<r>.json``: every check's name and ``"ok"`` or what
went wrong. A check that fails does not stop the others (each is symmetric across ranks, so
one failing check cannot leave the ranks out of step).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable

import numpy as np
import torch

import hvdrunner.hvd_torch as hvd

RESULTS: dict[str, str] = {}


def check(fn: Callable[[], None]) -> Callable[[], None]:
    try:
        fn()
        RESULTS[fn.__name__] = "ok"
    except Exception:  # noqa: BLE001 - recorded, shown by the test
        RESULTS[fn.__name__] = traceback.format_exc(limit=4)
    print(f"rank {os.environ.get('RANK')}: {fn.__name__}: {RESULTS[fn.__name__]}", file=sys.stderr,
          flush=True)  # fmt: skip
    return fn


def raises(kind: type[BaseException], fn: Callable[[], object], *words: str) -> str:
    """``fn()`` must raise ``kind`` (within 30 s: never a hang) with every word in its text."""
    t0 = time.monotonic()
    try:
        fn()
    except kind as exc:
        text = str(exc)
        assert time.monotonic() - t0 < 30, f"took {time.monotonic() - t0:.0f} s"
        assert all(w in text for w in words), f"{words} not in {text!r}"
        return text
    raise AssertionError(f"{fn} did not raise {kind.__name__}")


def main(out: str) -> None:
    raises(ValueError, hvd.rank, "hvd.init()")  # use before init
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    np.random.default_rng(r)
    everyone = [np.random.default_rng(q).integers(-50, 50, (3, 4)) for q in range(n)]
    mine = everyone[r]

    @check
    def topology() -> None:
        assert (hvd.size(), hvd.local_size(), hvd.cross_size()) == (n, n, 1)
        assert hvd.local_rank() == r and hvd.cross_rank() == 0
        assert hvd.gloo_built() and not hvd.mpi_built() and hvd.gloo_enabled()
        try:
            import horovod  # noqa: F401

            raise AssertionError("horovod was importable: the engine must not need it")
        except ImportError:
            pass

    @check
    def allreduce_ops_against_numpy() -> None:
        stack = np.stack(everyone)
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.int16):
            t = torch.tensor(mine, dtype=dtype)
            expect = {hvd.Sum: stack.sum(0), hvd.Min: stack.min(0), hvd.Max: stack.max(0),
                      hvd.Product: stack.prod(0)}  # fmt: skip
            for op, want in expect.items():
                got = hvd.allreduce(t, op=op).numpy()
                assert np.array_equal(got, want.astype(got.dtype)), (dtype, op, got, want)
            avg = hvd.allreduce(t, op=hvd.Average).numpy()
            want = stack.sum(0) / n if dtype.is_floating_point else np.trunc(stack.sum(0) / n)
            assert np.allclose(avg, want), (dtype, avg, want)
        scaled = hvd.allreduce(torch.ones(2), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
        assert torch.equal(scaled, torch.full((2,), float(n)))

    @check
    def allreduce_in_place_grouped_and_async() -> None:
        t = torch.full((5,), float(r))
        hvd.allreduce_(t, op=hvd.Sum)
        assert torch.equal(t, torch.full((5,), float(sum(range(n)))))
        outs = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3, 1) * r], op=hvd.Sum)
        assert [o.shape for o in outs] == [torch.Size([2]), torch.Size([3, 1])]
        handles = [hvd.allreduce_async(torch.ones(4) * i, name=f"async.{i}", op=hvd.Sum)
                   for i in range(6)]  # fmt: skip
        results = [hvd.synchronize(h) for h in handles]
        assert all(torch.equal(x, torch.ones(4) * i * n) for i, x in enumerate(results))

    @check
    def allgather_of_different_first_dimensions() -> None:
        t = torch.full((r + 1, 2), float(r))
        got = hvd.allgather(t).numpy()
        want = np.concatenate([np.full((q + 1, 2), float(q)) for q in range(n)])
        assert np.array_equal(got, want)
        objs = hvd.allgather_object({"rank": r})
        assert objs == [{"rank": q} for q in range(n)]

    @check
    def broadcast_and_objects() -> None:
        t = torch.tensor(mine)
        assert np.array_equal(hvd.broadcast(t, root_rank=n - 1).numpy(), everyone[n - 1])
        t2 = torch.zeros(3) + r
        hvd.broadcast_(t2, root_rank=0)
        assert torch.equal(t2, torch.zeros(3))
        assert hvd.broadcast_object({"x": [1, 2]} if r == 0 else None) == {"x": [1, 2]}

    @check
    def alltoall_with_splits() -> None:
        splits = [q + 1 for q in range(n)]  # rank r sends q + 1 rows to rank q
        rows = torch.arange(sum(splits), dtype=torch.float32).unsqueeze(1) + 100 * r
        out, received = hvd.alltoall(rows, splits=torch.tensor(splits, dtype=torch.int32))
        assert received.tolist() == [r + 1] * n
        assert out.shape == (n * (r + 1), 1)

    @check
    def reducescatter_split_rows() -> None:
        rows = 2 * n + 1
        t = torch.arange(rows * 2, dtype=torch.float32).view(rows, 2)
        got = hvd.reducescatter(t, op=hvd.Sum)
        start = sum(2 + (1 if q < 1 else 0) for q in range(r))
        want = (t * n)[start : start + 2 + (1 if r < 1 else 0)]
        assert torch.equal(got, want), (got, want)

    @check
    def mismatches_raise_on_every_rank() -> None:
        raises(RuntimeError, lambda: hvd.allreduce(torch.ones(3 + r)), "shapes", "rank 0")
        dtype = torch.float32 if r == 0 else torch.float64
        raises(RuntimeError, lambda: hvd.allreduce(torch.ones(3, dtype=dtype)), "data type")
        op = hvd.Sum if r == 0 else hvd.Max
        raises(RuntimeError, lambda: hvd.allreduce(torch.ones(3), op=op), "reduction op")
        raises(RuntimeError, lambda: hvd.broadcast(torch.ones(3), root_rank=r), "root rank")
        raises(NotImplementedError, lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), "Adasum")
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))

    @check
    def requests_no_other_rank_makes_fail_instead_of_hanging() -> None:
        name = "only.on.rank0" if r == 0 else "only.on.the.others"
        text = raises(RuntimeError, lambda: hvd.allreduce(torch.ones(1), name=name), "never")
        assert "only.on.rank0" in text and "only.on.the.others" in text, text
        assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))

    @check
    def duplicate_names_in_flight() -> None:
        hvd.allreduce_async(torch.ones(2), name="dup")
        raises(ValueError, lambda: hvd.allreduce_async(torch.ones(2), name="dup"), "same name")
        hvd.barrier()

    @check
    def process_sets() -> None:
        first = hvd.add_process_set([0])
        rest = hvd.add_process_set(list(range(1, n)))
        mine_set = first if r == 0 else rest
        got = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=mine_set)
        assert got.item() == len(mine_set.ranks)
        other = rest if r == 0 else first
        raises(RuntimeError, lambda: hvd.allreduce(torch.ones(1), process_set=other), "not in")
        hvd.remove_process_set(first)
        hvd.remove_process_set(rest)

    @check
    def uneven_join() -> None:
        steps = 3 + r  # the last rank has the most batches
        total = torch.zeros(1)
        for _ in range(steps):
            total += hvd.allreduce(torch.ones(1), op=hvd.Sum)
        last = hvd.join()
        assert last == n - 1, last
        # ranks that joined served zeros: step s counts the ranks with more than s batches
        assert total.item() == sum(sum(1 for q in range(n) if 3 + q > s) for s in range(steps))

    @check
    def optimizer_matches_the_averaged_gradient() -> None:
        x = torch.tensor(everyone[r][:, :3], dtype=torch.float32)
        for options in ({}, {"groups": 1}, {"backward_passes_per_step": 2},
                        {"gradient_predivide_factor": 2.0}):  # fmt: skip
            torch.manual_seed(0)
            model = torch.nn.Linear(3, 1, bias=False)  # a model's hooks belong to one optimizer
            w0 = model.weight.detach().clone()
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters(), **options)  # fmt: skip
            passes = options.get("backward_passes_per_step", 1)
            opt.zero_grad()
            for _ in range(passes):
                model(x).sum().backward()
            opt.step()
            grads = [passes * everyone[q][:, :3].sum(0) for q in range(n)]
            want = w0.numpy() - 0.1 * np.mean(grads, axis=0)
            assert np.allclose(model.weight.detach().numpy(), want, atol=1e-4), (options, want)

    @check
    def sync_batch_norm_is_batch_norm_of_every_rank() -> None:
        full = torch.tensor(np.concatenate(everyone), dtype=torch.float32)
        sbn, bn = hvd.SyncBatchNorm(4), torch.nn.BatchNorm1d(4)
        mine_rows = full[3 * r : 3 * r + 3].clone().requires_grad_()
        out = sbn(mine_rows)
        ref = bn(full)
        assert torch.allclose(out, ref[3 * r : 3 * r + 3], atol=1e-5)
        assert torch.allclose(sbn.running_var, bn.running_var, atol=1e-5)

    @check
    def timeline_is_a_chrome_trace() -> None:
        path = os.path.join(out, f"timeline-{os.getpid()}.json")  # the test's folder, not /tmp
        hvd.start_timeline(path)
        hvd.allreduce(torch.ones(2), name="traced")
        hvd.stop_timeline()
        if r == 0:
            with open(path) as f:
                events = json.load(f)
            assert any(e.get("name") == "NEGOTIATE_ALLREDUCE" for e in events), events

    hvd.barrier()
    hvd.shutdown()
    hvd.init()  # init after shutdown works
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n
    hvd.shutdown()
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump(RESULTS, f)


if __name__ == "__main__":
    main(sys.argv[1])
