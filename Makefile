# engramprof: `make demo` runs the guided demo, `make test` runs the tests. Both set up first.
PY := .venv/bin/python
.PHONY: setup demo test bench
setup:
	@./scripts/setup.sh
demo: setup
	$(PY) -m engramprof demo
test: setup
	$(PY) -m pytest -q -rfEs --durations=15 $(PYTEST_ARGS)
bench: setup
	$(PY) benchmarks/syscalls_overhead.py
