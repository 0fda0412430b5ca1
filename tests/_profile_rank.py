"""One rank of the distributed `samu-tune profile` test (run as a script by tests/test_cli.py):
its own cache dir (as on separate hosts), the torch reference only (fast on the CPU)."""
import os
import sys


def main(rank: int, world: int, port: str, root: str, shapes: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TRITON_INTERPRET="0",
                      SAMU_TUNE_CACHE_DIR=os.path.join(root, f"rank{rank}"))
    from samu_tune.cli import main as cli
    code = cli(["profile", "--shapes", shapes, "--device", "cpu", "--strategies", "reference",
                "--json", "--quick"])
    sys.exit(code)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
