"""What the benchmarks share (not benchmarks themselves: `tools/test.sh` runs `bench/*.py`)."""
