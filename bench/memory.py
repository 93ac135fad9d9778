"""The memory a provider of bench/side_by_side.py reads its q, k, v from: 'NAME@bshd' or
'NAME@bhsd'. Each layout's tensors exist once; a provider given the other layout gets views of
them, so two providers can read the same bytes. Without '@', fa4 reads the BSHD tensors (what
fa4.flash_attn_func takes) and the SDPA peers the BHSD ones (what SDPA's callers pass).

    python3 bench/memory.py   # self-test (no GPU): prints "memory self-test: ok"
"""

from __future__ import annotations

LAYOUTS = ("bshd", "bhsd")


def memory_of(provider):
    """'NAME@MEM' -> (NAME, MEM); 'NAME' -> (NAME, NAME's own layout). A memory other than bshd or
    bhsd raises ValueError naming it."""
    name, _, mem = provider.partition("@")
    if not mem:
        mem = "bshd" if name == "fa4" else "bhsd"
    if mem not in LAYOUTS:
        raise ValueError(f"provider {provider!r}: memory {mem!r} is not one of {', '.join(LAYOUTS)}")
    return name, mem


def _self_test():
    assert memory_of("fa4") == ("fa4", "bshd")
    assert memory_of("fa4@bhsd") == ("fa4", "bhsd")
    for peer in ("cudnn", "fa2", "flex"):
        assert memory_of(peer) == (peer, "bhsd")
        assert memory_of(peer + "@bshd") == (peer, "bshd")
    try:
        memory_of("fa2@sbhd")
    except ValueError as e:
        assert "'sbhd'" in str(e) and "fa2@sbhd" in str(e), e
    else:
        raise AssertionError("memory_of took an unknown memory")
    print("memory self-test: ok")


if __name__ == "__main__":
    _self_test()
