"""The Open Inference Protocol one layer down: datatype table, tensor forms, body split, token scopes."""
from __future__ import annotations

import numpy as np
import pytest

from modelyard.errors import ServingError
from modelyard.model import dtypes
from modelyard.serving.protocol import v2_tensors
from modelyard.serving.protocol.v2_rest import decode_inputs, requested_outputs, split_body
from modelyard.serving.protocol.v2_service import model_spec


def test_every_v2_datatype_maps_both_ways():
    for name in ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                 "FP16", "FP32", "FP64", "BYTES", "BF16"):
        assert dtypes.v2_datatype(dtypes.from_v2_datatype(name)) == name
    with pytest.raises(ValueError, match="unknown datatype 'FP8'"):
        dtypes.from_v2_datatype("FP8")
    with pytest.raises(TypeError):
        dtypes.v2_datatype(dtypes.DT_COMPLEX64)


@pytest.mark.parametrize("datatype, array", [
    ("FP32", np.float32([[1.5, -2], [3, 4]])), ("INT64", np.int64([[-(2**40), 7]])), ("UINT16", np.uint16([1, 65535])),
    ("BOOL", np.array([True, False])), ("FP16", np.float16([0.5, 2])), ("BYTES", np.array([b"a", b"", b"\xff"], object)),
])
def test_raw_round_trip(datatype, array):
    tensor = v2_tensors.from_raw("x", datatype, list(array.shape), v2_tensors.to_raw(array))
    assert tensor.array.dtype == array.dtype and tensor.array.tolist() == array.tolist()


def test_json_flat_and_nested_agree_and_values_are_checked():
    flat = v2_tensors.from_json("x", "INT32", [2, 2], [1, 2, 3, 4]).array
    nested = v2_tensors.from_json("x", "INT32", [2, 2], [[1, 2], [3, 4]]).array
    assert flat.dtype == np.int32 and flat.tolist() == nested.tolist() == [[1, 2], [3, 4]]
    for data, words in (([0.5], "not of type uint8"), ([256], "out of range"), (["a"], "holds numbers")):
        with pytest.raises(ServingError, match=words):
            v2_tensors.from_json("x", "UINT8", [1], data)
    with pytest.raises(ServingError, match="holds 3 elements"):
        v2_tensors.from_json("x", "FP32", [3], [1, 2])
    with pytest.raises(ServingError, match="non-negative integers"):
        v2_tensors.from_json("x", "FP32", [-1], [1])
    assert v2_tensors.from_json("s", "BYTES", [2], ["é", "b"]).array.tolist() == ["é".encode(), b"b"]


def test_bytes_raw_refuses_cut_elements():
    raw = v2_tensors.to_raw(np.array([b"abc"], object))
    with pytest.raises(ServingError, match="cut short"):
        v2_tensors.from_raw("s", "BYTES", [1], raw[:-1])
    with pytest.raises(ServingError, match="ends after 1 of 2"):
        v2_tensors.from_raw("s", "BYTES", [2], raw)


def test_binary_body_split_and_outputs_asked_for():
    head = b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],' \
           b' "outputs": [{"name": "y", "parameters": {"binary_data": true}}, {"name": "z"}]}'
    request, binary = split_body(head + np.float32([1, 2]).tobytes(), str(len(head)).encode())
    (tensor,) = decode_inputs(request, binary)
    assert tensor.array.tolist() == [1.0, 2.0]
    names, binary_of = requested_outputs(request)
    assert names == ["y", "z"] and binary_of("y") and not binary_of("z")
    assert requested_outputs({"parameters": {"binary_data_output": True}})[1]("any")
    with pytest.raises(ServingError, match="byte count"):
        split_body(head, b"abc")


def test_version_strings():
    assert model_spec("m", "") == model_spec("m", None) and model_spec("m", None).version is None
    assert model_spec("m", "3").version == 3 and model_spec("m", "stable").label == "stable"


def test_v2_calls_need_the_scopes_of_their_tf_serving_twins(tmp_path):
    from modelyard.serving.security.auth import ADMIN, OPEN, PREDICT, READ, AuthPolicy, Authorizer

    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-of-sixteen-chars predict\n")
    auth = Authorizer(AuthPolicy(str(tokens), open_health=True))
    assert auth.rest_scope("POST", "/v2/models/m/versions/1/infer", None) == PREDICT
    assert auth.rest_scope("POST", "/v2/repository/models/m/load", None) == ADMIN
    assert auth.rest_scope("GET", "/v2/health/ready", None) is OPEN
    assert auth.rest_scope("GET", "/v2/models/m", None) == READ
    assert auth.grpc_scope("/inference.GRPCInferenceService/ModelInfer") == PREDICT
    assert auth.grpc_scope("/inference.GRPCInferenceService/RepositoryModelUnload") == ADMIN
    assert auth.grpc_scope("/inference.GRPCInferenceService/ModelMetadata") == READ


def test_repository_changes_reach_workers_as_the_config_they_came_from(tmp_path):
    """V2's repository load/unload reaches --workers peers as a ModelServerConfig: one that reads back the same."""
    from pathlib import Path

    from modelyard.serving.manager.config import config_proto, model_configs
    from modelyard.serving.manager.manager import ModelConfig
    from modelyard.serving.manager.versions import VersionPolicy

    configs = [ModelConfig("a", Path("/m/a")),
               ModelConfig("b", Path("/m/b"), VersionPolicy("all"), {"stable": 1}),
               ModelConfig("c", Path("/m/c"), VersionPolicy("specific", versions=frozenset({1, 3})), {"x": 3}),
               ModelConfig("d", Path("/m/d"), VersionPolicy("latest", num_versions=2))]
    assert model_configs(config_proto(configs)) == configs
    assert model_configs(config_proto([])) == []


def test_numeric_data_read_from_the_body_text_equals_the_parsed_lists():
    """JSON ``data`` of numbers is cut from the body's text and read in C (v2_tensors.read_numbers): the
    same arrays as from the parsed lists, and the same errors (worded by the general path)."""
    import orjson

    from modelyard.serving.protocol import v2_rest

    def both(body: bytes):
        plain = v2_rest.decode_inputs(orjson.loads(body), memoryview(b""))
        return plain, v2_rest.decode_inputs(*v2_rest.split_body(body, None))

    cases = [
        b'{"inputs":[{"name":"a","shape":[2,3],"datatype":"UINT8","data":[[0,1,2],[253,254,255]]}]}',
        b'{"inputs":[{"name":"a","shape":[3],"datatype":"FP32","data":[1, 2.5, -3e2]},'
        b' {"name":"b","shape":[2],"datatype":"INT64","data":[-9007199254740993, 7], "parameters":{}}]}',
        b'{"inputs":[{"data":[1,2],"name":"a","shape":[2],"datatype":"INT32"},'
        b'{"name":"s","shape":[1],"datatype":"BYTES","data":["x"]}]}',  # a BYTES input: lists for all
        b'{"inputs":[{"name":"a","shape":[1],"datatype":"FP64","data":[0.1],"parameters":{"data":[5]}}]}',
        b'{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","data":[1,2]}],"outputs":[{"name":"y",'
        b'"parameters":{"data":[1]}}]}',  # a "data" array outside the inputs: the body is parsed whole
        b'{"inputs":[{"name":"a","shape":[2,2],"datatype":"INT16","data":[[1,2],[3,4]]},'
        b'{"name":"b","shape":[2],"datatype":"BOOL","data":[true,false]},'
        b'{"name":"c","shape":[0],"datatype":"FP32","data":[]}]}',
        b'{"inputs":[{"name":"data","shape":[2],"datatype":"FP32","data" :\n [ 1 , 2e0 ] },'
        b'{"name":"s","shape":[2],"datatype":"BYTES","data":["]","[1]"]}], "id":"\\"data\\":[9]"}',
    ]
    for body in cases:
        plain, fast = both(body)
        for x, y in zip(plain, fast):
            assert x.array.dtype == y.array.dtype and x.array.shape == y.array.shape, body
            assert x.array.tolist() == y.array.tolist(), body
    for bad, words in ((b'{"inputs":[{"name":"a","shape":[2],"datatype":"UINT8","data":[1,300]}]}', "out of range"),
                       (b'{"inputs":[{"name":"a","shape":[2],"datatype":"INT8","data":[1,2.5]}]}', "not of type int8"),
                       (b'{"inputs":[{"name":"a","shape":[2],"datatype":"BOOL","data":[1,0]}]}', "true/false"),
                       (b'{"inputs":[{"name":"a","shape":[3],"datatype":"FP32","data":[1,,2]}]}', "malformed JSON"),
                       (b'{"inputs":[{"name":"a","shape":[3],"datatype":"FP32","data":[[1,2],[3]]}]}',
                        "not a regular nested list"),
                       (b'{"inputs":[{"name":"a","shape":[2],"datatype":"FP32","data":[1,2]},'
                        b'{"name":"b","shape":[2],"datatype":"FP32","data":{"\\u0000data":0}}]}', "list of numbers")):
        with pytest.raises(ServingError, match=words):
            v2_rest.decode_inputs(*v2_rest.split_body(bad, None))


def test_a_request_layout_seen_before_decodes_and_fails_as_the_general_path():
    """``read_infer`` keeps what it learnt of a JSON request apart from its numbers (v2_rest._Plan):
    the second request of a layout answers the same inputs, outputs, binary choice and id as the
    first, and its numbers are still checked, with the general path's errors."""
    import orjson

    from modelyard.serving.protocol import v2_rest

    def general(body: bytes):
        request = orjson.loads(body)
        inputs = v2_rest.decode_inputs(request, memoryview(b""))
        names, binary = v2_rest.requested_outputs(request)
        return inputs, names, binary("y"), request.get("id", v2_rest.NO_ID)

    v2_rest._PLANS.clear()
    cases = [
        b'{"inputs":[{"name":"a","shape":[1,3],"datatype":"UINT8","data":[0,1,%d]}]}',
        b'{"id":[1,{"k":"v"}],"inputs":[{"name":"a","shape":[2],"datatype":"FP32","data":[1.5,%d]},'
        b'{"name":"b","shape":[1],"datatype":"INT64","data":[%d],"parameters":{"x":1}}],'
        b'"outputs":[{"name":"y","parameters":{"binary_data":true}}],"parameters":{"binary_data_output":false}}',
        b'{"inputs":[{"name":"s","shape":[1],"datatype":"BYTES","data":["%d"]}]}',  # no array cut out: not kept
    ]
    for case in cases:
        for value in (7, 9, 11):
            body = case.replace(b"%d", str(value).encode())
            want, got = general(body), v2_rest.read_infer(body, None)
            assert [t.name for t in got[0]] == [t.name for t in want[0]], body
            assert [t.array.tolist() for t in got[0]] == [t.array.tolist() for t in want[0]], body
            assert [t.array.dtype for t in got[0]] == [t.array.dtype for t in want[0]], body
            assert (got[1], got[2]("y"), got[3] if got[3] is v2_rest.NO_ID else orjson.dumps(got[3])) == \
                (want[1], want[2], want[3] if want[3] is v2_rest.NO_ID else orjson.dumps(want[3])), body
    assert len(v2_rest._PLANS) == 2
    layout = cases[0]
    for value, words in ((b"300", "out of range"), (b"2.5", "not of type uint8"), (b"1,2", "holds 3 elements"),
                         (b"-1", "out of range"), (b'"x"', "holds numbers"), (b"[1]", "not a regular nested list")):
        body = layout.replace(b"%d", value)
        with pytest.raises(ServingError) as general_error:
            general(body)
        with pytest.raises(ServingError) as planned_error:
            v2_rest.read_infer(body, None)
        assert planned_error.value.message == general_error.value.message, body
        assert planned_error.match(words)
    with pytest.raises(ServingError, match="shape"):  # a layout the general path refuses is never kept
        v2_rest.read_infer(b'{"inputs":[{"name":"a","shape":[-1],"datatype":"UINT8","data":[1]}]}', None)
    with pytest.raises(ServingError, match="shape"):
        v2_rest.read_infer(b'{"inputs":[{"name":"a","shape":[-1],"datatype":"UINT8","data":[1]}]}', None)


def test_grpc_infer_response_bytes_are_the_generated_messages():
    """v2_grpc writes ModelInferResponse's bytes from cached pieces: the same bytes the generated
    message serializes, for several outputs, BYTES, an empty shape and with or without an id."""
    from tritonclient.grpc import service_pb2 as pb

    from modelyard.serving.protocol import v2_grpc
    from modelyard.serving.protocol.v2_service import InferResult

    fields = pb.ModelInferResponse.DESCRIPTOR.fields_by_name
    assert (fields["id"].number, fields["outputs"].number, fields["raw_output_contents"].number) == (3, 5, 6)
    outputs = {"scores": np.float32([[0.5, -1, 3e-8]]), "label": np.int64([7]), "scalar": np.float64(2.5),
               "text": np.array([b"ab", b""], dtype=object), "empty": np.zeros((0, 3), np.int32)}
    for request_id in ("", "req-1"):
        for version in (1, 12345678901):
            request = pb.ModelInferRequest(model_name="m", id=request_id)
            result = InferResult("m", version, {k: np.asarray(v) for k, v in outputs.items()})
            want = pb.ModelInferResponse(model_name="m", model_version=str(version), id=request_id)
            for alias, array in result.outputs.items():
                want.outputs.add(name=alias, datatype=v2_tensors.output_datatype(array), shape=array.shape)
                want.raw_output_contents.append(v2_tensors.to_raw(array))
            got = v2_grpc._infer_response(pb, request, result)
            assert got == want.SerializeToString()
            assert pb.ModelInferResponse.FromString(got) == want


def test_rest_infer_answer_is_what_orjson_writes_for_the_whole_answer():
    """v2_rest.infer_answer writes the answer's fixed parts once (per version, per output): the same
    bytes as orjson.dumps of the whole answer, with JSON and binary outputs, ids of every JSON kind."""
    import orjson

    from modelyard.serving.protocol import v2_rest
    from modelyard.serving.protocol.v2_service import InferResult

    outputs = {"scores": np.float32([[0.5, -1, 3e-8]]), "label": np.int64([7]), "flag": np.bool_([True]),
               "text": np.array([b"\xc3\xa9t\xc3\xa9", b"\""], dtype=object), "half": np.float16([1.5]),
               "scalar": np.float64(2.5), "empty": np.zeros((0, 3), np.int32), "ü\"name": np.uint8([1, 2])}
    result = InferResult("mödel", 3, {k: np.asarray(v) for k, v in outputs.items()})
    for request_id in (v2_rest.NO_ID, "a\"b", 12, None, [1, {"x": 2.5}]):
        for binary in (lambda alias: False, lambda alias: alias in ("label", "text")):
            tensors, chunks = [], []
            for alias, array in result.outputs.items():
                tensor = {"name": alias, "datatype": v2_tensors.output_datatype(array), "shape": list(array.shape)}
                if binary(alias):
                    raw = v2_tensors.to_raw(array)
                    tensor["parameters"] = {"binary_data_size": len(raw)}
                    chunks.append(raw)
                else:
                    tensor["data"] = v2_tensors.to_json_data(array)
                tensors.append(tensor)
            answer = {"model_name": "mödel", "model_version": "3", "outputs": tensors}
            if request_id is not v2_rest.NO_ID:
                answer["id"] = request_id
            want = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
            assert v2_rest.infer_answer(request_id, result, binary) == (want, chunks)
