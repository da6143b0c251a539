"""The lab's scenarios by name: every impairment the lab can inject, and its spec.

:mod:`.impairments` holds the base class and the four causes' impairments, :mod:`.evicting`
the two that evict the table from another process; this module only lists them.
"""
from __future__ import annotations

from engramprof.lab.evicting import EVICTING_IMPAIRMENTS
from engramprof.lab.impairments import (
    HealthyImpairment,
    Impairment,
    PythonSchedulingImpairment,
    ReclaimImpairment,
    ResidencyImpairment,
    Spec,
    StorageImpairment,
)

IMPAIRMENTS: dict[str, type[Impairment]] = {cls.spec.name: cls for cls in (
    PythonSchedulingImpairment, HealthyImpairment, ResidencyImpairment, ReclaimImpairment, StorageImpairment,
    *EVICTING_IMPAIRMENTS)}
SCENARIOS: dict[str, Spec] = {name: cls.spec for name, cls in IMPAIRMENTS.items()}
