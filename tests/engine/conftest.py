"""Puts tests/engine on sys.path so test modules can import `engine_factories`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
