#!/usr/bin/env python3
"""An independent roz.v1 client: Python stubs generated from proto/ with
grpcio-tools, driving one StreamSession against a running rozd.

Usage: session_client.py HOST:PORT | https://HOST:PORT
(token, if needed, from $ROZD_TOKEN)

With https:// it connects like the published roz CLI: TLS with the default
roots (no CA given here: grpcio's default roots, which
$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH replaces) and the bearer token.

It starts a session with the client tool `py_add`, asks the local model to
call it, answers the ToolRequest, checks the streamed answer and the
TurnComplete, then ends the session with CancelSession and expects the
server to close the stream. Exit status: 0 on success, 1 when the daemon's
behaviour is wrong, 2 on the overall timeout, 3 when the stubs cannot be
generated or imported.
"""

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

OVERALL_TIMEOUT_SECS = 30.0
REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "proto"
AGENT_PROTO = PROTO_DIR / "roz" / "v1" / "agent.proto"
MESSAGE_ID = "py-1"


class Failure(Exception):
    """The daemon did something the contract does not allow."""


def log(text):
    print(f"session_client: {text}", flush=True)


def fail(text):
    raise Failure(text)


def check(condition, text):
    if not condition:
        fail(text)


def start_watchdog():
    """Ends the process, whatever it is blocked on, after the overall timeout."""

    def expire():
        print(
            f"session_client: FAIL: timed out after {OVERALL_TIMEOUT_SECS:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)

    timer = threading.Timer(OVERALL_TIMEOUT_SECS, expire)
    timer.daemon = True
    timer.start()


def generate_stubs(out_dir):
    """Runs grpc_tools.protoc on proto/ into out_dir and imports the result."""
    import grpc_tools

    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(AGENT_PROTO),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise RuntimeError(
            f"protoc failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
        )
    sys.path.insert(0, str(out_dir))
    from roz.v1 import agent_pb2, agent_pb2_grpc

    return agent_pb2, agent_pb2_grpc


def run(addr, pb, pb_grpc):
    import grpc
    from google.protobuf import json_format
    from google.protobuf.struct_pb2 import Struct

    requests = queue.Queue()

    def request_stream():
        # Ends (half-closes) only when told to, after the server closed the stream.
        while True:
            item = requests.get()
            if item is None:
                return
            yield item

    if addr.startswith("https://"):
        addr = addr[len("https://"):].rstrip("/")
        channel = grpc.secure_channel(addr, grpc.ssl_channel_credentials())
    else:
        channel = grpc.insecure_channel(addr)
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
    except grpc.FutureTimeoutError:
        fail(f"cannot connect to {addr}")
    stub = pb_grpc.AgentServiceStub(channel)
    token = os.environ.get("ROZD_TOKEN")
    metadata = [("authorization", f"Bearer {token}")] if token else None
    responses = stub.StreamSession(
        request_stream(), timeout=OVERALL_TIMEOUT_SECS, metadata=metadata
    )

    schema = Struct()
    schema.update(
        {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        }
    )
    requests.put(
        pb.SessionRequest(
            start=pb.StartSession(
                environment_id="py-lab",
                tools=[
                    pb.ToolSchema(
                        name="py_add",
                        description="Adds a and b (runs in the Python client).",
                        parameters_schema=schema,
                        timeout_ms=5000,
                        category=pb.TOOL_CATEGORY_PURE,
                    )
                ],
            )
        )
    )

    noise = {"keepalive", "presence_hint", "activity_update", "thinking_delta"}

    def next_significant(what):
        for response in responses:
            kind = response.WhichOneof("response")
            if kind in noise:
                continue
            if kind == "error":
                e = response.error
                fail(f"SessionError while waiting for {what}: code={e.code!r} message={e.message!r}")
            return kind, response
        fail(f"the stream ended while waiting for {what}")

    kind, response = next_significant("SessionStarted")
    check(kind == "session_started", f"expected session_started, got {kind}: {response}")
    session_id = response.session_started.session_id
    check(session_id, "SessionStarted has no session_id")
    log(f"session {session_id} started on model {response.session_started.model!r}")

    requests.put(
        pb.SessionRequest(
            user_message=pb.UserMessage(
                content='call py_add {"a": 2, "b": 3}', message_id=MESSAGE_ID
            )
        )
    )
    text = []
    tool_calls = 0
    while True:
        kind, response = next_significant("the turn to complete")
        if kind == "text_delta":
            delta = response.text_delta
            check(
                delta.message_id == MESSAGE_ID,
                f"TextDelta.message_id is {delta.message_id!r}, expected {MESSAGE_ID!r}",
            )
            text.append(delta.content)
        elif kind == "tool_request":
            call = response.tool_request
            params = json_format.MessageToDict(call.parameters)
            log(f"ToolRequest {call.tool_call_id} {call.tool_name} {json.dumps(params)}")
            check(call.tool_name == "py_add", f"ToolRequest for {call.tool_name!r}, expected 'py_add'")
            check(params == {"a": 2, "b": 3}, f"ToolRequest parameters {params}, expected a=2, b=3")
            check(call.tool_call_id, "ToolRequest has no tool_call_id")
            tool_calls += 1
            requests.put(
                pb.SessionRequest(
                    tool_result=pb.ToolResult(
                        tool_call_id=call.tool_call_id,
                        success=True,
                        result=str(int(params["a"] + params["b"])),
                        exit_code=0,
                        duration_ms=1,
                    )
                )
            )
        elif kind == "turn_complete":
            done = response.turn_complete
            break
        else:
            fail(f"unexpected {kind} during the turn: {response}")

    answer = "".join(text)
    log(f"TurnComplete stop_reason={done.stop_reason!r} usage={json_format.MessageToDict(done.usage)}")
    check(tool_calls == 1, f"expected one ToolRequest, got {tool_calls}")
    check(
        done.message_id == MESSAGE_ID,
        f"TurnComplete.message_id is {done.message_id!r}, expected {MESSAGE_ID!r}",
    )
    check(done.stop_reason == "end_turn", f"stop_reason is {done.stop_reason!r}, expected 'end_turn'")
    check("py_add returned: 5" in answer, f"answer {answer!r} lacks 'py_add returned: 5'")
    check(done.usage.input_tokens > 0, f"usage.input_tokens is {done.usage.input_tokens}")
    check(done.usage.output_tokens > 0, f"usage.output_tokens is {done.usage.output_tokens}")

    requests.put(pb.SessionRequest(cancel_session=pb.CancelSession(reason="python client done")))
    try:
        for response in responses:
            kind = response.WhichOneof("response")
            if kind in noise:
                continue
            fail(f"expected the stream to end after CancelSession, got {kind}: {response}")
    except grpc.RpcError as e:
        fail(f"the stream ended with {e.code()}: {e.details()} instead of closing cleanly")
    finally:
        requests.put(None)
        channel.close()
    log("the server closed the stream after CancelSession")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 64
    start_watchdog()
    with tempfile.TemporaryDirectory(prefix="roz-py-stubs-") as out_dir:
        try:
            pb, pb_grpc = generate_stubs(out_dir)
        except Exception as e:  # noqa: BLE001 - any setup failure is reported the same way
            print(f"session_client: FAIL: cannot generate stubs: {e}", file=sys.stderr)
            return 3
        import grpc

        try:
            run(sys.argv[1], pb, pb_grpc)
        except Failure as e:
            print(f"session_client: FAIL: {e}", file=sys.stderr)
            return 1
        except grpc.RpcError as e:
            print(f"session_client: FAIL: RPC error {e.code()}: {e.details()}", file=sys.stderr)
            return 1
    log("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
