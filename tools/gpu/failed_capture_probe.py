"""After a failed CUDA-graph capture: is the CUDA generator usable, and what restores it?"""

import torch

torch.randn(4, device="cuda")
state = torch.cuda.get_rng_state()


def fail_capture(kind):
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            y = torch.randn(10, device="cuda")
            if kind == "sync":
                y.sum().item()
            else:
                raise ValueError("python error inside capture")
    except Exception as e:  # noqa: BLE001
        print(f"  capture failed ({kind}): {type(e).__name__}: {str(e)[:80]}")


for kind in ("python", "sync"):
    print("case", kind)
    fail_capture(kind)
    for attempt in ("plain", "set_rng_state", "manual_seed"):
        try:
            if attempt == "set_rng_state":
                torch.cuda.set_rng_state(state)
            if attempt == "manual_seed":
                torch.cuda.manual_seed(0)
            torch.randn(3, device="cuda").sum().item()
            print("  random op after", attempt, "ok")
            break
        except Exception as e:  # noqa: BLE001
            print("  random op after", attempt, "fails:", type(e).__name__, str(e)[:90])
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            static = torch.zeros(3, device="cuda")
            with torch.cuda.graph(g, stream=s):
                static.copy_(torch.randn(3, device="cuda"))
        torch.cuda.current_stream().wait_stream(s)
        g.replay()
        a = static.clone()
        g.replay()
        print("  a later capture works; replays differ:", not torch.equal(a, static))
    except Exception as e:  # noqa: BLE001
        print("  a later capture fails:", type(e).__name__, str(e)[:90])
