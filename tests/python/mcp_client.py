#!/usr/bin/env python3
"""An independent MCP client (the official Python SDK, PyPI `mcp`) driving
rozd's MCP server, over streamable HTTP or through `rozd mcp` (stdio).

Usage:
  mcp_client.py MODE --http URL [--token T]
  mcp_client.py MODE --stdio ROZD_BINARY ADDR [--token T]

It prints one JSON object per line on stdout for each step, and where the
test must act (trigger the protective stop, answer an approval) it says so
and, for steps marked `await_*`, waits for a line on stdin before it goes on.
Modes:

  scenario  tools, a sensor, the Observation resource and an update of it
            after subscribing, an out-of-range command, approved/denied
            commands (answered by the test over REST), a command under the
            protective stop; then holds the session open until killed.
  elicit    declares elicitation: the first command is approved by the
            "user", the second declined; then ends the session.
  timeout   a command nobody answers; then ends the session.
  reconnect reads a sensor, waits for `go` (the test restarts the daemon
            meanwhile), reads it again; then ends the session.
  manual    lists the resources and reads rozd://embodiment and
            rozd://manual, lists the prompts and gets operate_robot; then
            ends the session.
  connect   only connects (for the refused-token check).

Failures to connect are printed as {"step": "refused", "error": ...} and
the process exits with status 3.
"""

import argparse
import asyncio
import json
import sys
import warnings

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult, Implementation, ResourceUpdatedNotification

CLIENT_NAME = "rozd-test"
# resources/subscribe is deprecated from 2026-07-28 on; rozd speaks 2025-11-25.
warnings.filterwarnings("ignore", category=DeprecationWarning)
# The URIs of the resource updates the server sent.
UPDATES = asyncio.Queue()


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}, default=str), flush=True)


async def wait_for_go():
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() != "go":
        raise SystemExit(f"expected 'go' on stdin, got {line!r}")


def result(r):
    return {
        "is_error": bool(r.is_error),
        "text": r.content[0].text if r.content else None,
        "structured": r.structured_content,
        "meta": r.meta,
    }


def tool_view(t):
    return {
        "name": t.name,
        "description": t.description,
        "input_schema": t.input_schema,
        "annotations": t.annotations.model_dump(exclude_none=True, by_alias=True) if t.annotations else None,
        "meta": t.meta,
    }


async def scenario(c):
    tools = await c.list_tools()
    emit("tools", tools=[tool_view(t) for t in tools.tools])
    emit("read_sensor", **result(await c.call_tool("read_sensor", {"name": "temp"})))
    emit("read_history", **result(await c.call_tool("read_sensor", {"name": "temp", "history": 3})))
    emit("read_too_much", **result(await c.call_tool("read_sensor", {"name": "temp", "history": 100000})))
    emit("out_of_range", **result(await c.call_tool("arm", {"value": 5})))
    # Waits until the test approves it over REST.
    emit("calling")
    emit("approved_call", **result(await c.call_tool("arm", {"value": 0.5})))
    observation = await c.read_resource("roz://observation")
    emit("resource", observation=json.loads(observation.contents[0].text))
    await c.subscribe_resource("roz://observation")
    emit("resource_updated", uri=await asyncio.wait_for(UPDATES.get(), 20))
    await c.unsubscribe_resource("roz://observation")
    emit("await_estop")
    await wait_for_go()
    emit("under_stop", **result(await c.call_tool("arm", {"value": 0.3})))
    emit("await_clear")
    await wait_for_go()
    emit("calling")
    emit("denied_call", **result(await c.call_tool("arm", {"value": 0.1})))
    emit("calling")
    emit("second_call", **result(await c.call_tool("arm", {"value": -0.4})))
    emit("holding")
    await asyncio.Event().wait()


async def elicit_mode(c):
    emit("elicit_approved", **result(await c.call_tool("arm", {"value": 0.5})))
    emit("elicit_declined", **result(await c.call_tool("arm", {"value": 0.2})))


async def timeout_mode(c):
    emit("timed_out", **result(await c.call_tool("arm", {"value": 0.5})))


async def reconnect_mode(c):
    emit("first", **result(await c.call_tool("read_sensor", {"name": "temp"})))
    emit("await_restart")
    await wait_for_go()
    emit("second", **result(await c.call_tool("read_sensor", {"name": "temp"})))


async def manual_mode(c):
    resources = await c.list_resources()
    emit("resources", resources=[
        {"uri": str(r.uri), "name": r.name, "mime_type": r.mime_type} for r in resources.resources
    ])
    for uri in ["rozd://embodiment", "rozd://manual"]:
        read = await c.read_resource(uri)
        emit("read", uri=uri, text=read.contents[0].text, mime_type=read.contents[0].mime_type)
    prompts = await c.list_prompts()
    emit("prompts", prompts=[{"name": p.name, "description": p.description} for p in prompts.prompts])
    prompt = await c.get_prompt("operate_robot")
    emit("prompt", description=prompt.description,
         messages=[{"role": m.role, "text": m.content.text} for m in prompt.messages])


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["scenario", "elicit", "timeout", "reconnect", "manual", "connect"])
    parser.add_argument("--http")
    parser.add_argument("--stdio", nargs=2, metavar=("ROZD", "ADDR"))
    parser.add_argument("--token")
    args = parser.parse_args()

    # Every HTTP status the SDK saw (it does not say which one refused it).
    statuses = []

    async def note_status(response):
        statuses.append(response.status_code)

    if args.stdio:
        env = {"ROZD_TOKEN": args.token} if args.token else {}
        server = StdioServerParameters(command=args.stdio[0], args=["mcp", "--addr", args.stdio[1]], env=env)
    else:
        headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
        http = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(30.0, read=300.0),
            event_hooks={"response": [note_status]},
        )
        server = streamable_http_client(args.http, http_client=http)

    answers = iter([True, False])

    async def elicitation(context, params):
        approve = next(answers)
        emit("elicitation", message=params.message, approve=approve)
        if approve:
            return ElicitResult(action="accept", content={"approve": True})
        return ElicitResult(action="decline")

    async def notifications(message):
        if isinstance(message, ResourceUpdatedNotification):
            UPDATES.put_nowait(message.params.uri)

    options = {
        "client_info": Implementation(name=CLIENT_NAME, version="1"),
        "message_handler": notifications,
    }
    if args.mode == "elicit":
        options["elicitation_callback"] = elicitation
    try:
        client = Client(server, **options)
        await client.__aenter__()
    except BaseException as e:  # noqa: BLE001 - any failure to connect is the answer
        emit("refused", error=repr(e), statuses=statuses)
        raise SystemExit(3) from None
    emit("connected", protocol=client.protocol_version)
    try:
        if args.mode == "scenario":
            await scenario(client)
        elif args.mode == "elicit":
            await elicit_mode(client)
        elif args.mode == "timeout":
            await timeout_mode(client)
        elif args.mode == "reconnect":
            await reconnect_mode(client)
        elif args.mode == "manual":
            await manual_mode(client)
    finally:
        await client.__aexit__(None, None, None)
    emit("closed")


asyncio.run(main())
