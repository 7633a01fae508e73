#!/usr/bin/env bash
# Installs the coding-agent CLIs that the real-agent tests run
# (tests/agents, README "Using a real agent") at the versions pinned here,
# into a cache folder (target/agents-cli, or FVD_AGENT_CLI_CACHE): Node and
# npm from Debian first when the machine has none, then the npm packages.
# The install is skipped while the folder holds exactly these pins.
# FVD_AGENT_GEMINI=1 adds Gemini CLI (it needs Node 20; Debian 12 ships 18).
# Prints the folder of the programs (for FVD_AGENT_CLI_DIR) on stdout;
# everything else goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
pins=(@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 opencode-ai@1.18.33)
programs=(claude codex opencode)
if [ "${FVD_AGENT_GEMINI:-}" = 1 ]; then
    pins+=(@google/gemini-cli@0.61.0)
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
stamp="$dir/pins.txt"
if [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
    echo "agent CLIs: npm install ${pins[*]} into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --no-save --loglevel=error "${pins[@]}" >&2
    echo "${pins[*]}" >"$stamp"
else
    echo "agent CLIs: cached in $dir" >&2
fi
home=$(mktemp -d)
for p in "${programs[@]}"; do
    echo "agent CLIs: $p $(HOME="$home" "$dir/node_modules/.bin/$p" --version 2>/dev/null | head -1)" >&2
done
rm -rf "$home"
echo "agent CLIs: ready in $((SECONDS - started)) s (node $(node --version))" >&2
echo "$dir/node_modules/.bin"
