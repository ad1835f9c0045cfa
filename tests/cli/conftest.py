"""Fixtures of the CLI tests that several files share: a fleet's recordings (two hosts,
:mod:`fleet`) and its report, made once per test module that asks for them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fleet import build_fleet, report


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("work")
    return build_fleet(tmp_path_factory.mktemp("fleet") / "fleet", work)


@pytest.fixture(scope="module")
def rep(fleet: Path) -> dict[str, Any]:
    return report(fleet)
