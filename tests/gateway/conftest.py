"""Puts tests/gateway on sys.path so test modules can import `responder` and `gw_harness`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
