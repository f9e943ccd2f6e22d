"""A Modbus device for rozd's tests: PyPI pymodbus's own server (TCP, or
RTU on a serial port such as one end of a socat pty pair) with a datastore
the test controls over stdin, one JSON command a line, one JSON answer a
line on stdout:

  {"set": "holding", "address": 0, "values": [1, 2]}   -> {"ok": true}
  {"get": "coil", "address": 0, "count": 2}            -> {"values": [...]}
  {"writes": true}      -> {"writes": [{"fc": 6, "address": 1, "values": [5]}, ...]}
  {"delay_ms": 300}     -> every reply that long late from now on (0: none)
  {"busy": 2}           -> the next 2 requests answer "server device busy"
  {"busy_writes": 1}    -> the next write answers "server device busy"
  {"corrupt": 1}        -> the next reply's last byte is flipped (a CRC
                           error on RTU)

`--set holding:100:5555` (repeatable) sets a value before it listens.

Tables: holding and input registers 0-199, coils and discrete inputs
0-255; an address beyond them answers "illegal data address". Prints
{"ready": true} once it listens.
"""

import argparse
import asyncio
import json
import sys

from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusSerialServer, ModbusTcpServer
from pymodbus.simulator import DataType, SimData, SimDevice

FC_READ = {"coil": 1, "discrete_input": 2, "holding": 3, "input": 4}
FC_WRITE = {"coil": 15, "discrete_input": 2, "holding": 16, "input": 4}

state = {"delay": 0.0, "busy": 0, "busy_writes": 0, "corrupt": 0, "writes": [], "internal": False}


async def action(function_code, _start, address, count, _registers, set_values):
    if state["internal"]:
        return None
    if set_values is not None:
        state["writes"].append(
            {"fc": function_code, "address": address, "values": [int(v) for v in set_values]}
        )
    if set_values is not None and state["busy_writes"] > 0:
        state["busy_writes"] -= 1
        return ExcCodes.DEVICE_BUSY
    if state["busy"] > 0:
        state["busy"] -= 1
        return ExcCodes.DEVICE_BUSY
    if state["delay"]:
        await asyncio.sleep(state["delay"])
    return None


def trace_packet(sending, data):
    if sending and state["corrupt"] > 0 and data:
        state["corrupt"] -= 1
        return data[:-1] + bytes([data[-1] ^ 0xFF])
    return data


async def command(server, unit, line):
    cmd = json.loads(line)
    ctx = server.context
    state["internal"] = True
    try:
        if "set" in cmd:
            values = cmd["values"]
            if cmd["set"] in ("coil", "discrete_input"):
                values = [bool(v) for v in values]
            err = await ctx.async_setValues(unit, FC_WRITE[cmd["set"]], cmd["address"], values)
            return {"ok": err is None, "error": str(err) if err else None}
        if "get" in cmd:
            values = await ctx.async_getValues(
                unit, FC_READ[cmd["get"]], cmd["address"], cmd.get("count", 1)
            )
            if isinstance(values, list):
                return {"values": [int(v) for v in values]}
            return {"error": str(values)}
    finally:
        state["internal"] = False
    if "writes" in cmd:
        return {"writes": state["writes"]}
    if "delay_ms" in cmd:
        state["delay"] = cmd["delay_ms"] / 1000.0
        return {"ok": True}
    if "busy_writes" in cmd:
        state["busy_writes"] = cmd["busy_writes"]
        return {"ok": True}
    if "busy" in cmd:
        state["busy"] = cmd["busy"]
        return {"ok": True}
    if "corrupt" in cmd:
        state["corrupt"] = cmd["corrupt"]
        return {"ok": True}
    return {"error": f"unknown command {line!r}"}


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tcp", type=int, help="listen on 127.0.0.1:PORT")
    p.add_argument("--serial", help="serve RTU on this serial port")
    p.add_argument("--baud", type=int, default=19200)
    p.add_argument("--parity", default="E")
    p.add_argument("--unit", type=int, default=1)
    p.add_argument("--set", action="append", default=[], help="TABLE:ADDRESS:VALUE")
    args = p.parse_args()

    device = SimDevice(
        id=args.unit,
        simdata=(
            [SimData(0, count=256, values=False, datatype=DataType.BITS)],
            [SimData(0, count=256, values=False, datatype=DataType.BITS)],
            [SimData(0, count=200, values=0, datatype=DataType.REGISTERS)],
            [SimData(0, count=200, values=0, datatype=DataType.REGISTERS)],
        ),
        use_bit_addressing=True,
        action=action,
    )
    if args.tcp:
        server = ModbusTcpServer(device, address=("127.0.0.1", args.tcp))
    else:
        server = ModbusSerialServer(
            device,
            port=args.serial,
            baudrate=args.baud,
            parity=args.parity,
            trace_packet=trace_packet,
        )
    for item in args.set:
        table, address, value = item.split(":")
        await command(
            server,
            args.unit,
            json.dumps({"set": table, "address": int(address), "values": [int(value)]}),
        )
    await server.serve_forever(background=True)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := await reader.readline():
        if not line.strip():
            continue
        try:
            answer = await command(server, args.unit, line)
        except Exception as e:  # the test sees what went wrong
            answer = {"error": repr(e)}
        print(json.dumps(answer), flush=True)
    await server.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
