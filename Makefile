# Everything a fresh machine needs: `make demo` and `make test` create the environment themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# CPU build of torch, pinned for set-up and CI (an unpinned torch pulls a multi-GB CUDA build).
TORCH  ?= torch==2.13.0

.PHONY: install test demo bench bench-revisions same-bytes fuzz clean

install: $(STAMP)

# setup.py builds the C extensions (codecs/csrc, ckptstore/storage/csrc): an editable install
# rebuilds them only here
$(STAMP): pyproject.toml Makefile setup.py $(wildcard codecs/csrc/*.c codecs/csrc/*.h ckptstore/storage/csrc/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

demo: $(STAMP)
	$(PY) examples/demo.py

# the compiled kernels' fuzz targets, twin and safety tests against an AddressSanitizer +
# UndefinedBehaviorSanitizer build of them (needs gcc with libasan; FUZZ_EXAMPLES per target)
FUZZ_EXAMPLES ?= 2000
fuzz: $(STAMP)
	$(PY) tests/codecs/asan_fuzz.py --examples $(FUZZ_EXAMPLES)

# every table of docs/benchmarks.md (about 20 minutes on 2 cores)
bench: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/store_io.py --repeat 9
	$(PY) benchmarks/codecs.py
	$(PY) benchmarks/lossless.py
	$(PY) benchmarks/autotune.py
	$(PY) benchmarks/async_writer.py
	$(PY) benchmarks/dlrm.py
	$(PY) benchmarks/dense_digits.py
	$(PY) benchmarks/transfer_minilm.py
	$(PY) benchmarks/sharded.py
	$(PY) benchmarks/scale_sim.py
	$(PY) benchmarks/hot_rows.py
	$(PY) benchmarks/cpr.py --plot docs/cpr_overhead.png
	$(PY) benchmarks/cpr_ranks.py

# the library of the working tree against an earlier revision, side by side (about 10 minutes)
BASE ?= HEAD~1
bench-revisions: $(STAMP)
	$(PY) benchmarks/revisions.py --base $(BASE)

# the refactoring guard: every policy's 7-commit sequence writes the same bytes as $(BASE)
# (about 2 minutes: each revision's C extensions are built in its archive first)
same-bytes: $(STAMP)
	$(PY) benchmarks/same_bytes_revisions.py --base $(BASE)

clean:
	rm -rf $(VENV) build *.egg-info demo-store
