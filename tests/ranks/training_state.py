"""hpccomm.TrainingState.resume between ranks at different steps: the ones behind get the state of the one ahead.

Usage: training_state.py (2 ranks or more; no fault-tolerant mode needed)

Rank 1 trains 3 steps with Adam (scalar ``step`` tensors, two buffers per
parameter; a 2 MiB layer, so both the in-place and the end-to-end paths are
taken), the others none (their optimizers have no state, as a
replacement's). After ``resume`` every rank must hold rank 1's parameters,
optimizer state and extra state exactly, and agree on its step. A second
``resume`` with every rank at the same step sends nothing and changes
nothing. Prints ``OK rank=R``.
"""

from __future__ import annotations

import fast_exit  # noqa: F401  (first: its gc.freeze is the last exit handler; see that module)
import hpccomm
import torch
import torch.distributed as dist


class Loader:
    """Extra state a user registers: a data loader's position, and an RNG's."""

    def __init__(self) -> None:
        self.position, self.rng = 0, torch.Generator().manual_seed(0)

    def state_dict(self) -> dict:
        return {"position": self.position, "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.rng.set_state(state["rng"])


def main() -> None:
    dist.init_process_group("hpccomm")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 32768))  # 2 MiB of weights
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = Loader()
    state = hpccomm.TrainingState(model=model, optimizer=optimizer)
    state.register("loader", loader)
    try:
        state.register("bad", object())  # type: ignore[arg-type]
        raise SystemExit("registering an object without state_dict was accepted")
    except TypeError as error:
        assert "bad" in str(error), error
    step = 0
    if rank == 1:
        for step in range(1, 4):
            optimizer.zero_grad()
            model(torch.randn(4, 8, generator=loader.rng)).square().mean().backward()
            optimizer.step()
            loader.position += 4
    resumed = state.resume(step)
    assert resumed == 3, resumed
    # Every rank now holds rank 1's state: gathered and compared element by element.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]
                     + [t.flatten().float() for s in optimizer.state.values() for t in s.values()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(other, gathered[1]) for other in gathered), "states differ after resume"
    assert len(optimizer.state) == 4 and loader.position == 12, (len(optimizer.state), loader.position)
    draws = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(draws, torch.rand(1, generator=loader.rng))
    assert all(torch.equal(d, draws[0]) for d in draws), "the registered RNG state was not taken over"
    before = flat.clone()
    assert state.resume(resumed) == 3
    after = torch.cat([p.detach().flatten() for p in model.parameters()]
                      + [t.flatten().float() for s in optimizer.state.values() for t in s.values()])
    assert torch.equal(before, after)
    print(f"OK rank={rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
