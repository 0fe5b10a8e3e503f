"""Fixtures of the Kubernetes adapter tests: pods and nodes as the API server serialises them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # fakeapi.py, kubefixtures.py (importlib import mode)
