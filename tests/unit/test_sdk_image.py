"""The SDK's Image: immutable, checked at construction with sentences naming the field, chaining
helpers, requirements files, and the same JSON and content-hash id as the contract's ImageSpec."""

from __future__ import annotations

import json

import msgspec
import pytest
from contracts_strategies import images
from hypothesis import given
from hypothesis import strategies as st

from levers9 import App, Image
from levers9.contracts import images as contract
from levers9.contracts.spec import ImageSpec, decode_spec
from levers9.options import PLATFORM_BASE


def image_of(spec: ImageSpec) -> Image:
    return Image(python_packages=spec.python_packages, apt_packages=spec.apt_packages, commands=spec.commands,
                 env=spec.env, base_image=spec.base_image or None)


@given(images)
def test_the_sdk_id_and_json_are_the_contracts(spec):
    img = image_of(spec)
    assert msgspec.convert(img.to_dict(), ImageSpec) == spec
    assert img.id == contract.image_id(spec)
    assert set(img.to_dict()) <= set(ImageSpec.__struct_fields__)


def test_the_platform_base_is_the_contracts():
    assert PLATFORM_BASE == contract.PLATFORM_BASE
    assert Image().python_version == "3.11" and Image(base_image="python:3.12-slim").python_version is None


@given(images, st.lists(st.sampled_from(["humanize==4.9.0", "six"]), max_size=2),
       st.lists(st.sampled_from(["echo a", "touch /x"]), max_size=2))
def test_chaining_returns_new_images_and_leaves_the_old_one(spec, pkgs, cmds):
    img = image_of(spec)
    before = (img.id, img.to_dict())
    more = img.add_python_packages(*pkgs).add_commands(*cmds).with_env({"MODE": "x"}, EXTRA="1")
    assert (img.id, img.to_dict()) == before
    assert more.python_packages == img.python_packages + tuple(pkgs)
    assert more.commands == img.commands + tuple(cmds)
    assert more.env == {**img.env, "MODE": "x", "EXTRA": "1"}
    assert more.id == contract.image_id(msgspec.convert(more.to_dict(), ImageSpec))


def test_immutable_and_hashable():
    img = Image(python_packages=["six"], env={"A": "1"})
    with pytest.raises(AttributeError):
        img.commands = ("x",)  # type: ignore[misc]
    with pytest.raises(TypeError):
        img.env["A"] = "2"  # type: ignore[index]
    assert hash(img) == hash(Image(python_packages=["six"], env={"A": "1"})) and img == Image(
        python_packages=("six",), env={"A": "1"})
    assert img.add_apt_packages(["curl", "git"]).apt_packages == ("curl", "git")


@pytest.mark.parametrize("kwargs, message", [
    ({"python_packages": "numpy"}, "Image python_packages 'numpy' is not valid: use a list of strings"),
    ({"python_packages": ["--index-url=x"]}, "Image python_packages item '--index-url=x' is not valid"),
    ({"python_packages": ["numpy\nscipy"]}, "on one line"),
    ({"apt_packages": ["Curl"]}, "Image apt_packages item 'Curl' is not valid: use a Debian package name"),
    ({"commands": ["  "]}, "Image commands item '  ' is not valid"),
    ({"env": {"1A": "x"}}, "env name '1A' is not valid"),
    ({"env": {"A": 1}}, "is not a string"),
    ({"env": ["A=1"]}, "Image env ['A=1'] is not valid"),
    ({"base_image": "Debian:Bookworm"}, "Image base_image 'Debian:Bookworm' is not valid"),
])
def test_bad_fields_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(Exception) as e:
        Image(**kwargs)
    assert message in str(e.value)


def test_whatever_the_sdk_accepts_the_spec_decodes():
    img = Image(python_packages=["numpy==2.1.0", "requests[socks]>=2; python_version>'3'"],
                apt_packages=["curl", "libpq5=15.6-0+deb12u1"], commands=["echo 'a b' > /x"], env={"A": ""},
                base_image="localhost:5000/team/base:1")
    assert decode_spec(json.dumps({"name": "x", "code": {"module": "m", "handler": "h"},
                                   "image": img.to_dict()})).image == msgspec.convert(img.to_dict(), ImageSpec)


def test_from_requirements(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("# deps\nhumanize==4.9.0  # for sizes\n\n  six\nrequests[socks] \\\n>=2\n")
    img = Image.from_requirements(req, commands=["echo ok"])
    assert img.python_packages == ("humanize==4.9.0", "six", "requests[socks] >=2")
    assert img.commands == ("echo ok",)
    req.write_text("six\n-r other.txt\n")
    with pytest.raises(Exception, match=r"requirements.txt line 2: '-r other.txt' is a pip option"):
        Image.from_requirements(req)
    with pytest.raises(Exception, match="cannot read requirements file"):
        Image.from_requirements(tmp_path / "missing.txt")


def test_an_endpoint_carries_the_blueprint():
    app = App("imgs")
    img = Image(python_packages=["six"]).with_env(GREETING="hi")
    app.endpoint(name="a", image=img)(test_an_endpoint_carries_the_blueprint)
    [spec] = app.specs()
    assert spec["image"] == {"python_packages": ["six"], "env": {"GREETING": "hi"}}
    assert contract.image_id(decode_spec(json.dumps(spec)).image) == img.id
