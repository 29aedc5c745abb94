"""Kiln's MCP tests' client: the official MCP Python SDK, driving Kiln over stdio
(`kiln mcp`) or Streamable HTTP (a server's `/mcp`).

    client.py stdio KILN_BINARY URL [--tenant T] [--token-file F] < calls.json
    client.py http URL [--token TOKEN] [--tenant T] < calls.json

calls.json is a list of {"name": tool, "arguments": {...}} (or {"prompt": name,
"arguments": {...}}). Prints one JSON object: the server's name and protocol version, the
tools and prompts it lists, and each call's text and isError. A session that cannot be
opened (refused) prints {"error": ...} and exits 3.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client


async def drive(session, calls):
    init = await session.initialize()
    tools = await session.list_tools()
    prompts = await session.list_prompts()
    results = []
    for call in calls:
        if "prompt" in call:
            got = await session.get_prompt(call["prompt"], call.get("arguments", {}))
            results.append({
                "prompt": call["prompt"],
                "text": "\n".join(m.content.text for m in got.messages),
            })
            continue
        got = await session.call_tool(call["name"], call.get("arguments", {}))
        results.append({
            "name": call["name"],
            "arguments": call.get("arguments", {}),
            "isError": got.isError,
            "text": "\n".join(c.text for c in got.content if c.type == "text"),
        })
    return {
        "server": init.serverInfo.name,
        "protocolVersion": init.protocolVersion,
        "tools": [t.model_dump(exclude_none=True) for t in tools.tools],
        "prompts": [p.name for p in prompts.prompts],
        "calls": results,
    }


async def main():
    mode = sys.argv[1]
    calls = json.load(sys.stdin)
    if mode == "stdio":
        binary, url, *rest = sys.argv[2:]
        params = StdioServerParameters(command=binary, args=["mcp", "--url", url, *rest])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                return await drive(session, calls)
    url, *rest = sys.argv[2:]
    headers = {}
    for flag, value in zip(rest[::2], rest[1::2]):
        if flag == "--token":
            headers["Authorization"] = f"Bearer {value}"
        elif flag == "--tenant":
            headers["X-Scope-OrgID"] = value
    async with streamablehttp_client(url, headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            return await drive(session, calls)


if __name__ == "__main__":
    try:
        print(json.dumps(asyncio.run(main())))
    except BaseException as err:  # a refused session surfaces as an exception group
        causes = []
        stack = [err]
        while stack:
            e = stack.pop()
            causes.append(f"{type(e).__name__}: {e}")
            stack.extend(getattr(e, "exceptions", []) or [])
            if e.__cause__:
                stack.append(e.__cause__)
        print(json.dumps({"error": " | ".join(causes)}))
        sys.exit(3)
