"""The "hccl" backend between two CPU processes (a TP=2 group): collectives on
HPU tensors carry their data."""

from double_process import run_double

TWO_RANKS = """
import torch.multiprocessing as mp

def rank_main(rank, port, folder):
    import torch, torch.distributed as dist, habana_frameworks.torch
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2)
    assert dist.get_backend() == "hccl"
    x = torch.full((3,), float(rank + 1), device="hpu")
    dist.all_reduce(x)
    gathered = torch.empty(6, device="hpu")
    dist.all_gather_into_tensor(gathered, x * (rank + 1))
    source = torch.arange(3, device="hpu", dtype=torch.float32) * (rank + 1)
    dist.broadcast(source, 0)
    dist.barrier()
    result = [x.cpu().tolist(), gathered.cpu().tolist(), source.cpu().tolist()]
    with open(f"{folder}/rank{rank}", "w") as out:
        out.write(repr(result))
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = __file__.rsplit("/", 1)[0]
    mp.start_processes(rank_main, args=(port, folder), nprocs=2, start_method="spawn")
"""


def test_two_ranks_reduce_gather_and_broadcast(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    run_double(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    expected = [[3.0] * 3, [3.0] * 3 + [6.0] * 3, [0.0, 1.0, 2.0]]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}").read_text() == repr(expected)
