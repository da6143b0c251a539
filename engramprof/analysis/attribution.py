"""Per-call and per-batch time split into causes, and the verdict (``batch-tail``).

The model is documented once, in docs/model.md; the code is the pipeline of stages in
:mod:`engramprof.analysis`.  This module is the stable import path for it.
"""
from __future__ import annotations

from engramprof.analysis import DEFAULT_LOOP_GAP_US, BatchTailResult, analyse  # noqa: F401
from engramprof.analysis.calibrate import NORMAL_MISS_CEILING_US  # noqa: F401
from engramprof.analysis.components import distinct_per_batch as _distinct_per_batch  # noqa: F401
from engramprof.analysis.components import inflight_weights  # noqa: F401
from engramprof.analysis.context import SAMPLE_COLUMNS  # noqa: F401
from engramprof.analysis.events import CHUNK_CALLS  # noqa: F401
from engramprof.analysis.summary import TAIL_PERCENTILE  # noqa: F401
from engramprof.analysis.threads import SUBMITTER_COVERAGE  # noqa: F401
from engramprof.analysis.verdicts import (  # noqa: F401
                                          CAUSES,
                                          DEFAULT_MEANINGFUL_SHARE,
                                          DEFAULT_SLOW_MS,
                                          VERDICT_CAUSES,
                                          VERDICTS,
                                          col,
                                          is_slow,
                                          rank_causes,
                                          verdict_of,
)

