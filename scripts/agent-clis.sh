#!/usr/bin/env bash
# Installs the coding-agent CLIs that the real-agent tests run
# (tests/agents, docs/guide.md "Using a real agent") exactly as locked in
# tests/agents/clis/package-lock.json (versions and integrity hashes of
# every package), into a cache folder (target/agents-cli, or
# FVD_AGENT_CLI_CACHE): Node and npm from Debian first when the machine
# has none. The install is skipped while the folder holds that lock.
# FVD_AGENT_GEMINI=1 adds Gemini CLI (tests/agents/clis-gemini; it needs
# Node 20; Debian 12 ships 18). To move a pin: edit the package.json beside
# the lock, run `npm install --package-lock-only` there, commit both.
# Prints the folder of the programs (for FVD_AGENT_CLI_DIR) on stdout;
# everything else goes to stderr.

set -euo pipefail
cd "$(dirname "$0")/.."
locks=(tests/agents/clis)
programs=(claude codex opencode)
if [ "${FVD_AGENT_GEMINI:-}" = 1 ]; then
    locks+=(tests/agents/clis-gemini)
    programs+=(gemini)
fi
dir="${FVD_AGENT_CLI_CACHE:-$PWD/target/agents-cli}"
started=$SECONDS
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "agent CLIs: installing Debian's nodejs and npm" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm >&2
fi
mkdir -p "$dir"
bin="$dir/bin"
mkdir -p "$bin"
for lock in "${locks[@]}"; do
    into="$dir/$(basename "$lock")"
    if ! cmp -s "$lock/package-lock.json" "$into/package-lock.json"; then
        echo "agent CLIs: npm install of $lock into $into" >&2
        rm -rf "$into"
        mkdir -p "$into"
        cp "$lock/package.json" "$lock/package-lock.json" "$into/"
        # `npm install` over the lock, not `npm ci`: ci refuses a lock that
        # lacks the optional platform packages of other systems (opencode
        # lists twelve), which npm leaves out of it. The packages are still
        # the lock's, integrity checked; a lock npm had to change fails.
        # Install scripts on whatever an npmrc says: Claude Code and
        # opencode put their programs in place from one (issue #43: an npm
        # 11 setup skipped them, and both CLIs failed until run by hand).
        (cd "$into" && npm install --ignore-scripts=false --no-audit --no-fund --loglevel=error >&2)
        if ! cmp -s "$lock/package-lock.json" "$into/package-lock.json"; then
            echo "agent CLIs: npm changed $lock/package-lock.json while installing; refresh it (see this script's header)" >&2
            exit 1
        fi
    else
        echo "agent CLIs: $lock cached in $into" >&2
    fi
    for p in "$into"/node_modules/.bin/*; do
        ln -sf "$p" "$bin/$(basename "$p")"
    done
done
home=$(mktemp -d)
for p in "${programs[@]}"; do
    if ! v=$(HOME="$home" "$bin/$p" --version 2>/dev/null | head -1) || [ -z "$v" ]; then
        # A program whose install script did not run: run them now, once.
        echo "agent CLIs: $p does not answer --version; running the packages' install scripts (npm rebuild)" >&2
        for lock in "${locks[@]}"; do
            (cd "$dir/$(basename "$lock")" && npm rebuild --ignore-scripts=false --loglevel=error >&2)
        done
        if ! v=$(HOME="$home" "$bin/$p" --version 2>/dev/null | head -1) || [ -z "$v" ]; then
            echo "agent CLIs: $p still does not run ($bin/$p --version); remove $dir and run this script again" >&2
            exit 1
        fi
    fi
    echo "agent CLIs: $p $v" >&2
done
rm -rf "$home"
echo "agent CLIs: ready in $((SECONDS - started)) s (node $(node --version))" >&2
echo "$bin"
