"""Weight uploads to `rollwise serve` are all or nothing, and a reload's reply names the version it set.

Attacks: an upload whose last tensors are bad (a wrong shape, a NaN, an inf, an integer dtype, a name the model
lacks) after good ones with other values; before the fix the good ones were already copied in when the 400
came back. And 30 reloads at once: before the fix a reply could name another caller's version.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from serve_util import ADMIN_KEY, MODEL, post, request, start_server

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
PROBE = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 10, "temperature": 0, "ignore_eos": True,
         "return_token_ids": True, "logprobs": 2}


@pytest.fixture(scope="module")
def srv(char_ckpt):
    s = start_server(char_ckpt)
    yield s
    s.shutdown(drain_s=0.0)


def _outputs(srv) -> tuple[list[int], list[float], list]:
    ch = post(srv, "/v1/completions", PROBE).body["choices"][0]
    return ch["token_ids"], ch["logprobs"]["token_logprobs"], ch["logprobs"]["top_logprobs"]


def _version(srv) -> int:
    return request(srv.url + "/health").body["weight_version"]


def _other_tensors(other_ckpt) -> dict:
    from rollwise.models.loader import iter_safetensors

    return dict(iter_safetensors(other_ckpt))


def _poison(tensors: dict, how: str) -> tuple[dict, str]:
    """The other checkpoint's tensors (all good, other values) with the one sorting last spoiled; its name."""
    import torch

    out = dict(tensors)
    last = sorted(n for n, t in out.items() if t.ndim == 2)[-1]
    t = out[last].clone()
    if how == "shape":
        out[last] = t[:, :-1].contiguous()
    elif how == "nan":
        t[-1, -1] = float("nan")
        out[last] = t
    elif how == "inf":
        t[0, 0] = float("-inf")
        out[last] = t
    elif how == "int":
        out[last] = t.to(torch.int64)
    elif how == "name":
        last = "model.layers.99.zzz.weight"
        out[last] = t
    else:
        raise AssertionError(how)
    return out, last


def _upload(srv, tensors: dict, version: int | None = None):
    from safetensors.torch import save

    route = "/admin/load_weights" + ("" if version is None else f"?weight_version={version}")
    return post(srv, route, None, raw=save({k: v.contiguous() for k, v in tensors.items()}),
                headers={**AUTH, "Content-Type": "application/octet-stream"})


@pytest.mark.parametrize("how, fragment", [("shape", "shape mismatch"), ("nan", "non-finite"), ("inf", "non-finite"),
                                           ("int", "must be floating point"), ("name", "unexpected parameter")])
def test_a_refused_upload_leaves_outputs_bit_identical_and_the_version_unchanged(srv, other_ckpt, how, fragment):
    before, v0 = _outputs(srv), _version(srv)
    tensors, bad = _poison(_other_tensors(other_ckpt), how)
    r = _upload(srv, tensors, version=v0 + 50)
    assert r.status == 400, r.raw[:300]
    msg = r.body["error"]["message"]
    assert fragment in msg and bad in msg and "\n" not in msg, msg
    assert _outputs(srv) == before, "a refused upload changed the served weights"
    assert _version(srv) == v0


def test_a_refused_directory_load_changes_nothing(srv, other_ckpt, tmp_path):
    """The JSON routes (a checkpoint directory on the server) go through the same check."""
    import shutil

    from safetensors.torch import save_file

    shutil.copy(other_ckpt / "config.json", tmp_path / "config.json")
    tensors, bad = _poison(_other_tensors(other_ckpt), "nan")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    before, v0 = _outputs(srv), _version(srv)
    for route, body in (("/admin/load_weights", {"path": str(tmp_path)}),
                        ("/update_weights_from_disk", {"model_path": str(tmp_path)})):
        r = post(srv, route, body, headers=AUTH)
        assert r.status == 400 and bad in r.body["error"]["message"], r.raw[:300]
        assert _outputs(srv) == before and _version(srv) == v0


def test_a_good_upload_applies_whole(srv, char_ckpt, other_ckpt):
    """The probe above can see a change: the same upload, unspoiled, changes the outputs and the version."""
    from rollwise import LLM, SamplingParams

    before, v0 = _outputs(srv), _version(srv)
    r = _upload(srv, _other_tensors(other_ckpt))
    assert r.status == 200 and r.body["weight_version"] == v0 + 1, r.raw[:300]
    ref = LLM(other_ckpt, block_size=4, max_model_len=128).generate(
        [PROBE["prompt"]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].outputs[0]
    after = _outputs(srv)
    assert after[0] == list(ref.token_ids) and after != before
    assert _version(srv) == v0 + 1
    r = post(srv, "/admin/load_weights", {"path": str(char_ckpt)}, headers=AUTH)  # back to the served weights
    assert r.status == 200 and _outputs(srv) == before


def test_30_concurrent_reloads_each_reply_names_its_own_version(srv, char_ckpt):
    def load(v: int) -> int:
        r = post(srv, "/admin/load_weights", {"path": str(char_ckpt), "weight_version": v}, headers=AUTH)
        assert r.status == 200, r.raw[:300]
        return r.body["weight_version"]

    asked = list(range(1000, 1030))
    with ThreadPoolExecutor(30) as pool:
        got = list(pool.map(load, asked))
    wrong = [(a, g) for a, g in zip(asked, got) if a != g]
    assert not wrong, f"{len(wrong)} of 30 replies named another caller's version: {wrong[:5]}"
    assert _version(srv) in asked


def test_30_concurrent_unnumbered_reloads_get_30_distinct_versions(srv, char_ckpt):
    """Without weight_version each load is current + 1: the replies are the 30 versions after the start, once each."""
    v0 = _version(srv)

    def rpc(_: int) -> int:
        r = post(srv, "/collective_rpc", {"method": "reload_weights"}, headers=AUTH)
        assert r.status == 200, r.raw[:300]
        return r.body["weight_version"]

    with ThreadPoolExecutor(30) as pool:
        got = list(pool.map(rpc, range(30)))
    assert sorted(got) == list(range(v0 + 1, v0 + 31)), sorted(got)
    assert _version(srv) == v0 + 30
