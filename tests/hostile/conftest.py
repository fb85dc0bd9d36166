"""Puts tests/hostile on sys.path so test modules can import `hostile_cli`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
