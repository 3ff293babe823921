import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The generator's modules (protoc_gen_arctic, generate, arctic_*) are scripts in tools/codegen.
sys.path.insert(0, str(ROOT / "tools" / "codegen"))
