# tandemfs: the two commands that matter on a fresh machine are `make demo` and `make test`.
# Every target ends with a clear exit status; skipped parts say what was skipped and why.

SHELL  := /bin/bash
CARGO  ?= cargo
TANDEM := target/release/tandem
MOUNT_TESTS := tests/mount/run.sh

.PHONY: demo test build bench fmt clippy fuse-runtime toolchain

## demo: install the FUSE runtime when missing, build the release binary, run `tandem demo`
demo: fuse-runtime build
	./$(TANDEM) demo

build: toolchain
	$(CARGO) build --release -p tandem

toolchain:
	@command -v $(CARGO) >/dev/null 2>&1 || { echo "error: $(CARGO) not found; install Rust with https://rustup.rs (then open a new shell)" >&2; exit 1; }

# fusermount3 and the fuse kernel module come from the distribution, not from cargo. Installing
# needs root (or sudo); without either we stop with the command to run instead of half-working.
fuse-runtime:
	@if ! command -v fusermount3 >/dev/null 2>&1; then \
	    echo "fuse3 is not installed; installing it with apt-get"; \
	    if [ "$$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	    else echo "error: need root or sudo to run: apt-get install fuse3" >&2; exit 1; fi; \
	    $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fuse3 \
	      || { echo "error: could not install fuse3 (apt-get install fuse3)" >&2; exit 1; }; \
	fi
	@if [ ! -e /dev/fuse ]; then \
	    modprobe fuse 2>/dev/null || true; \
	    [ -e /dev/fuse ] || { echo "error: /dev/fuse is missing and 'modprobe fuse' did not create it" >&2; exit 1; }; \
	fi

## test: unit and integration tests of the whole workspace, then the FUSE mount suite when possible
# One bash recipe, so that the last line always says PASSED or FAILED whatever step failed.
test: toolchain
	@set -o pipefail; \
	fail() { echo "make test: FAILED ($$1)"; exit 1; }; \
	$(CARGO) test --workspace --release --no-fail-fast || fail "cargo test"; \
	if [ ! -f $(MOUNT_TESTS) ]; then \
	    echo "SKIPPED mount tests: $(MOUNT_TESTS) does not exist in this tree"; \
	elif [ "$$(id -u)" != 0 ]; then \
	    echo "SKIPPED mount tests: they need root (mounting, loop devices); run 'sudo make test'"; \
	elif [ ! -e /dev/fuse ]; then \
	    echo "SKIPPED mount tests: /dev/fuse is missing (apt-get install fuse3; modprobe fuse)"; \
	else \
	    $(CARGO) build --release -p tandem || fail "release build"; \
	    echo "running mount tests over /dev/fuse: $(MOUNT_TESTS) $(TANDEM)"; \
	    TRANSPORT=dev-fuse bash $(MOUNT_TESTS) $(TANDEM) 2>&1 | tee target/mount-tests.log || fail "mount tests"; \
	    failed=$$(tail -n 5 target/mount-tests.log | grep -oE '[0-9]+ failed' | tail -n 1 | grep -oE '[0-9]+'); \
	    [ -z "$$failed" ] || [ "$$failed" = 0 ] || fail "$$failed mount tests failed"; \
	    uring=$$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null || echo absent); \
	    if [ "$$uring" = Y ]; then \
	        echo "running mount tests over io_uring: TRANSPORT=uring $(MOUNT_TESTS) $(TANDEM)"; \
	        TRANSPORT=uring bash $(MOUNT_TESTS) $(TANDEM) 2>&1 | tee target/mount-tests-uring.log || fail "mount tests over io_uring"; \
	        failed=$$(tail -n 5 target/mount-tests-uring.log | grep -oE '[0-9]+ failed' | tail -n 1 | grep -oE '[0-9]+'); \
	        [ -z "$$failed" ] || [ "$$failed" = 0 ] || fail "$$failed mount tests over io_uring failed"; \
	    elif [ "$$uring" = absent ]; then \
	        echo "SKIPPED mount tests over io_uring: this kernel has no FUSE over io_uring (Linux 6.14 or later)"; \
	    else \
	        echo "SKIPPED mount tests over io_uring: /sys/module/fuse/parameters/enable_uring is $$uring (echo Y > it as root to run them)"; \
	    fi; \
	fi; \
	echo "make test: PASSED"

## bench: library-path and mount-path benchmarks against ext4 (ext4 needs root)
# The mount benchmark also measures libfuse's passthrough_ll example over ext4; Debian ships its
# source in libfuse3-dev, so as root we install that (with gcc and pkg-config) when missing.
bench: build
	@if [ "$$(id -u)" = 0 ] && [ ! -f /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c ] \
	    && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing libfuse3-dev, gcc and pkg-config for the passthrough comparison"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfuse3-dev gcc pkg-config \
	      || echo "note: could not install them; bench mount will skip the passthrough column"; \
	fi
	./$(TANDEM) bench meta
	@if [ -e /dev/fuse ] && [ "$$(id -u)" = 0 ]; then ./$(TANDEM) bench mount; \
	else echo "SKIPPED bench mount: needs root and /dev/fuse"; fi

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets
