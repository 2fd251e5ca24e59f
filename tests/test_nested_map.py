"""Tests for lingpipe.nested_map.NestedMap."""

import collections
import copy
import pickle

import numpy as np
import pytest
import tensorflow as tf

from lingpipe.nested_map import NestedMap

Pair = collections.namedtuple("Pair", ["first", "second"])


def _Sample() -> NestedMap:
    """A map exercising every container kind; leaves are ints 1..7 in tf.nest order."""
    return NestedMap(
        z=7,
        a=NestedMap(c=[2, 3], b=1),
        d={"y": 5, "x": 4},
        p=Pair(first=6, second=NestedMap()),
        e=(),
    )


# --- Attribute access and key checks ------------------------------------------------


def test_attribute_access_reads_writes_and_deletes_items():
    m = NestedMap(x=1)
    m.y = 2
    m["z"] = 3
    assert m.x == 1 and m["y"] == 2 and m.z == 3
    del m.x
    assert "x" not in m
    assert isinstance(m, dict)
    assert hasattr(m, "y") and not hasattr(m, "nope")
    assert "y" in dir(m)


def test_missing_attribute_lists_available_keys():
    m = NestedMap(alpha=1, beta=2)
    with pytest.raises(
        AttributeError, match=r"no key 'gamma'; available keys: \['alpha', 'beta'\]"
    ):
        _ = m.gamma
    with pytest.raises(AttributeError, match=r"no key 'gamma'.*\['alpha', 'beta'\]"):
        del m.gamma


def test_missing_attribute_suggests_close_key():
    m = NestedMap(length=3)
    with pytest.raises(AttributeError, match=r"did you mean 'length'\?"):
        _ = m.lenght


@pytest.mark.parametrize("key", ["1a", "a-b", "a.b", "", "a b", "é"])
def test_invalid_key_raises_value_error_naming_it(key):
    with pytest.raises(ValueError, match=f"NestedMap key {key!r} is not a valid identifier"):
        NestedMap()[key] = 1
    with pytest.raises(ValueError, match="is not a valid identifier"):
        NestedMap({key: 1})


def test_non_str_key_raises_value_error():
    with pytest.raises(ValueError, match=r"keys must be str; received 3 of type int"):
        NestedMap({3: "x"})


@pytest.mark.parametrize("key", ["keys", "items", "get", "copy", "Flatten", "Pack", "CheckKey"])
def test_reserved_key_raises_value_error(key):
    m = NestedMap()
    with pytest.raises(ValueError, match=f"NestedMap key '{key}' is reserved"):
        setattr(m, key, 1)
    with pytest.raises(ValueError, match=f"'{key}' is reserved"):
        m[key] = 1
    with pytest.raises(ValueError, match=f"'{key}' is reserved"):
        NestedMap(**{key: 1})
    assert key not in m


def test_dunder_key_is_reserved():
    with pytest.raises(ValueError, match="'__tf_flatten__' is reserved"):
        NestedMap(__tf_flatten__=1)


def test_reserved_key_in_constructor_keyword():
    with pytest.raises(ValueError, match=r"NestedMap key 'items' is reserved.*m\.items"):
        NestedMap(items=1)


def test_check_key_static_method():
    NestedMap.CheckKey("ok_key1")
    NestedMap.CheckKey("_private")
    with pytest.raises(ValueError, match="'0k' is not a valid identifier"):
        NestedMap.CheckKey("0k")
    with pytest.raises(ValueError, match="'values' is reserved"):
        NestedMap.CheckKey("values")


def test_dict_methods_that_bypass_setitem_still_check_keys():
    m = NestedMap(a=1)
    with pytest.raises(ValueError, match="'keys' is reserved"):
        m.update({"fine": 1, "keys": 2})  # Nothing is inserted.
    with pytest.raises(ValueError, match="'1x' is not a valid identifier"):
        m.update(**{"1x": 2})
    with pytest.raises(ValueError, match="'pop' is reserved"):
        m.setdefault("pop", 3)
    with pytest.raises(ValueError, match="'b c' is not a valid identifier"):
        m |= {"b c": 1}
    with pytest.raises(ValueError, match="'values' is reserved"):
        NestedMap.fromkeys(["values"])
    assert m == {"a": 1}
    m.update(b=2)
    assert m.setdefault("c", 3) == 3 and m.setdefault("a", 9) == 1
    assert m == {"a": 1, "b": 2, "c": 3}


def test_dict_operators_and_copy_return_nested_maps():
    m = NestedMap(a=1)
    for result in (m | {"b": 2}, {"b": 2} | m, m.copy(), NestedMap.fromkeys(["q"])):
        assert type(result) is NestedMap
    assert m | {"a": 2} == {"a": 2}
    assert {"a": 2} | m == {"a": 1}
    m |= {"b": 3}
    assert type(m) is NestedMap and m.b == 3
    shallow = m.copy()
    shallow.c = 4
    assert "c" not in m


def test_subclass_reserves_its_own_methods():
    class MyMap(NestedMap):
        def Extra(self):
            return 1

    with pytest.raises(ValueError, match="'Extra' is reserved: it names an attribute of MyMap"):
        MyMap(Extra=2)
    m = MyMap(a=[1, 2])
    assert type(m.Transform(lambda v: v + 1)) is MyMap


def test_repr_and_pickle_round_trip():
    m = NestedMap(a=1, b=NestedMap(c=[2]))
    assert repr(m) == "NestedMap({'a': 1, 'b': NestedMap({'c': [2]})})"
    restored = pickle.loads(pickle.dumps(m))
    assert restored == m
    assert type(restored) is NestedMap and type(restored.b) is NestedMap


# --- Construction and copies -------------------------------------------------------


def test_from_nested_dict_converts_every_dict():
    d = {"a": {"b": 1, "c": [{"d": 2}, ({"e": 3},)]}, "p": Pair({"f": 4}, 5)}
    m = NestedMap.FromNestedDict(d)
    assert type(m) is NestedMap
    assert type(m.a) is NestedMap
    assert type(m.a.c[0]) is NestedMap and m.a.c[0].d == 2
    assert type(m.a.c[1]) is tuple and type(m.a.c[1][0]) is NestedMap
    assert type(m.p) is Pair and type(m.p.first) is NestedMap
    assert m == d
    assert type(d["a"]) is dict  # The input is not modified.
    assert NestedMap.FromNestedDict([{"x": 1}]) == [NestedMap(x=1)]
    assert NestedMap.FromNestedDict(3) == 3


def test_from_nested_dict_rejects_bad_keys():
    with pytest.raises(ValueError, match="'bad key' is not a valid identifier"):
        NestedMap.FromNestedDict({"a": {"bad key": 1}})


def test_copy_copies_structure_but_shares_leaves():
    obj = np.array([0])  # A leaf (a list would be structure).
    m = NestedMap(a=NestedMap(b=obj), c=[1, NestedMap(d=2)], t=(obj,))
    c = m.Copy()
    assert c.a is not m.a and c.c is not m.c and c.c[1] is not m.c[1]
    assert c.a.b is obj and c.t[0] is obj
    c.a.x = 1
    c.c.append(3)
    assert "x" not in m.a and len(m.c) == 2
    assert type(c.a) is NestedMap


def test_deep_copy_copies_leaves_too():
    obj = np.array([1, 2])
    m = NestedMap(a=NestedMap(b=obj), t=tf.constant([3.0]))
    c = m.DeepCopy()
    assert type(c) is NestedMap and type(c.a) is NestedMap
    assert c.a is not m.a and c.a.b is not obj
    np.testing.assert_array_equal(c.a.b, obj)
    np.testing.assert_array_equal(c.t.numpy(), [3.0])
    c.a.b[0] = 9
    assert obj[0] == 1
    assert copy.deepcopy(m).a.b is not obj


# --- Flatten, Pack, Transform -------------------------------------------------------


def test_flatten_uses_sorted_tf_nest_order():
    m = _Sample()
    assert m.Flatten() == [1, 2, 3, 4, 5, 6, 7]
    assert m.Flatten() == tf.nest.flatten(m)
    assert NestedMap().Flatten() == []
    assert NestedMap(n=None).Flatten() == [None] == tf.nest.flatten(NestedMap(n=None))


def test_flatten_items_uses_dotted_keys_and_list_indices():
    assert _Sample().FlattenItems() == [
        ("a.b", 1),
        ("a.c[0]", 2),
        ("a.c[1]", 3),
        ("d.x", 4),
        ("d.y", 5),
        ("p[0]", 6),
        ("z", 7),
    ]
    nested = NestedMap(a=[[1, NestedMap(b=2)]])
    assert nested.FlattenItems() == [("a[0][0]", 1), ("a[0][1].b", 2)]


def test_pack_rebuilds_same_structure_and_types():
    m = _Sample()
    packed = m.Pack([10, 20, 30, 40, 50, 60, 70])
    assert packed == NestedMap(
        z=70, a=NestedMap(c=[20, 30], b=10), d={"y": 50, "x": 40}, p=Pair(60, NestedMap()), e=()
    )
    assert type(packed.a) is NestedMap and type(packed.d) is dict
    assert type(packed.p) is Pair and type(packed.p.second) is NestedMap
    assert type(packed.e) is tuple and type(packed.a.c) is list
    # Insertion order of the original is kept; only the traversal is sorted.
    assert list(packed) == list(m) == ["z", "a", "d", "p", "e"]
    assert packed.Flatten() == [10, 20, 30, 40, 50, 60, 70]
    assert m.Pack(m.Flatten()) == m


def test_pack_keeps_other_dict_types():
    m = NestedMap(o=collections.OrderedDict(b=1, a=2), dd=collections.defaultdict(list, k=3))
    packed = m.Pack(["K", "A", "B"])  # Order: dd.k, o.a, o.b.
    assert type(packed.o) is collections.OrderedDict and packed.o == {"a": "A", "b": "B"}
    assert list(packed.o) == ["b", "a"]
    assert type(packed.dd) is collections.defaultdict and packed.dd.default_factory is list
    assert packed.dd == {"k": "K"}


def test_pack_with_wrong_length_names_both_lengths():
    m = NestedMap(a=1, b=[2, 3])
    with pytest.raises(
        ValueError, match=r"received 2 values but this NestedMap has 3 leaves .*'b\[1\]'"
    ):
        m.Pack([1, 2])
    with pytest.raises(ValueError, match="received 4 values but this NestedMap has 3 leaves"):
        m.Pack([1, 2, 3, 4])


def test_transform_maps_leaves_into_new_map():
    m = _Sample()
    t = m.Transform(lambda v: v * 10)
    assert t.Flatten() == [10, 20, 30, 40, 50, 60, 70]
    assert m.Flatten() == [1, 2, 3, 4, 5, 6, 7]
    assert type(t) is NestedMap and t.IsCompatible(m)


def test_transform_with_key_passes_dotted_keys():
    m = NestedMap(a=NestedMap(b=1), c=[2])
    assert m.TransformWithKey(lambda k, v: f"{k}={v}") == NestedMap(
        a=NestedMap(b="a.b=1"), c=["c[0]=2"]
    )


# --- Filter ------------------------------------------------------------------------


def test_filter_keeps_matching_leaves_and_drops_emptied_containers():
    m = NestedMap(
        a=NestedMap(b=1, c=2), d=[3, 4], e=NestedMap(f=5), g=(7, 8), keep_empty=NestedMap()
    )
    f = m.Filter(lambda v: v % 2 == 0)
    assert f == NestedMap(a=NestedMap(c=2), d=[4], g=(8,), keep_empty=NestedMap())
    assert "e" not in f  # Emptied by the filter, so dropped.
    assert type(f.a) is NestedMap and type(f.g) is tuple
    assert m.a == {"b": 1, "c": 2}  # The original is untouched.


def test_filter_dropping_everything_returns_empty_map():
    m = NestedMap(a=NestedMap(b=1), c=[2])
    f = m.Filter(lambda v: False)
    assert f == {} and type(f) is NestedMap


def test_filter_namedtuple_whole_or_error():
    m = NestedMap(p=Pair(1, 2), q=3)
    assert m.Filter(lambda v: v == 3) == NestedMap(q=3)
    assert m.Filter(lambda v: True).p == Pair(1, 2)
    with pytest.raises(ValueError, match=r"cannot drop some fields of the namedtuple Pair at 'p'"):
        m.Filter(lambda v: v != 2)


def test_filter_key_val_sees_dotted_keys():
    m = NestedMap(a=NestedMap(w=1, b=2), c=[3, 4])
    seen = []

    def Keep(key, value):
        seen.append((key, value))
        return key.startswith("a.") or key == "c[1]"

    assert m.FilterKeyVal(Keep) == NestedMap(a=NestedMap(w=1, b=2), c=[4])
    assert seen == [("a.b", 2), ("a.w", 1), ("c[0]", 3), ("c[1]", 4)]


# --- IsCompatible and DebugString ---------------------------------------------------


def test_is_compatible_ignores_leaves_but_not_structure():
    m = _Sample()
    assert m.IsCompatible(m.Transform(str))
    assert m.IsCompatible(NestedMap.FromNestedDict({k: v for k, v in m.items()}))
    assert NestedMap(a=1).IsCompatible({"a": "x"})
    assert NestedMap(a=[1, 2]).IsCompatible(NestedMap(a=(3, 4)))
    assert not NestedMap(a=1).IsCompatible(NestedMap(b=1))
    assert not NestedMap(a=1).IsCompatible(NestedMap(a=1, b=2))
    assert not NestedMap(a=[1]).IsCompatible(NestedMap(a=[1, 2]))
    assert not NestedMap(a=[1]).IsCompatible(NestedMap(a=1))
    assert not NestedMap(a=NestedMap()).IsCompatible(NestedMap(a=[]))
    assert not NestedMap(a=NestedMap(b=1)).IsCompatible(NestedMap(a=NestedMap(b=[1])))
    assert not NestedMap(a=1).IsCompatible([1])


def test_debug_string_one_aligned_line_per_leaf():
    m = NestedMap(zz=3, a=NestedMap(long_name=1), b=[2])
    assert m.DebugString() == "a.long_name  1\nb[0]         2\nzz           3"
    assert NestedMap().DebugString() == ""


# --- Dotted keys -------------------------------------------------------------------


def test_get_item_and_get_follow_dotted_keys():
    m = NestedMap(a=NestedMap(b=NestedMap(c=1), l=[NestedMap(x=2), (3, 4)]), d={"e": 5})
    assert m.GetItem("a.b.c") == 1
    assert m.GetItem("a.b") is m.a.b
    assert m.GetItem("a.l[0].x") == 2
    assert m.GetItem("a.l[1][1]") == 4
    assert m.GetItem("d.e") == 5
    assert m.Get("a.b.c") == 1
    assert m.Get("a.b.missing") is None
    assert m.Get("a.b.missing", default=7) == 7
    assert m.Get("a.l[5]", 8) == 8
    assert m.Get("a.b.c.d", 9) == 9


def test_get_item_errors_name_the_path():
    m = NestedMap(a=NestedMap(b=1, c=[1]))
    with pytest.raises(KeyError, match=r"no key 'x' in 'a'; available keys: \['b', 'c'\]"):
        m.GetItem("a.x")
    with pytest.raises(KeyError, match=r"no key 'q' in the top level"):
        m.GetItem("q")
    with pytest.raises(IndexError, match=r"index 3 is out of range for 'a.c' of length 1"):
        m.GetItem("a.c[3]")
    with pytest.raises(TypeError, match=r"'a.b' is a int, not a dict, so it has no key 'z'"):
        m.GetItem("a.b.z")
    with pytest.raises(TypeError, match=r"'a' is a NestedMap, not a list or tuple"):
        m.GetItem("a[0]")


@pytest.mark.parametrize("key", ["", "a..b", "a.", "1a", "a[x]", "a[0", "a.b-c"])
def test_malformed_dotted_keys_raise_value_error(key):
    m = NestedMap(a=NestedMap(b=1))
    with pytest.raises(ValueError, match="NestedMap: .*nested key"):
        m.GetItem(key)
    with pytest.raises(ValueError, match="NestedMap: .*nested key"):
        m.Get(key, 0)
    with pytest.raises(ValueError, match="NestedMap: .*nested key"):
        m.Set(key, 0)


def test_set_creates_intermediate_nested_maps():
    m = NestedMap()
    m.Set("a.b.c", 1)
    assert m == {"a": {"b": {"c": 1}}}
    assert type(m.a) is NestedMap and type(m.a.b) is NestedMap
    m.Set("a.b.d", 2)
    m.Set("a.b.c", 3)
    assert m.a.b == {"c": 3, "d": 2}
    m.Set("top", 4)
    assert m.top == 4


def test_set_with_list_indices():
    m = NestedMap()
    m.Set("l[0]", "x")
    m.Set("l[1].name", "y")
    m.Set("l[0]", "z")
    assert m == {"l": ["z", {"name": "y"}]}
    assert type(m.l[1]) is NestedMap
    m.Set("grid[0][0]", 1)
    assert m.grid == [[1]]
    with pytest.raises(
        ValueError, match=r"index 5 is past the end of 'l' \(length 2\); set index 2"
    ):
        m.Set("l[5]", 1)


def test_set_into_plain_dict():
    m = NestedMap(d={"x": 1})
    m.Set("d.y", 2)
    assert m.d == {"x": 1, "y": 2} and type(m.d) is dict


def test_set_errors_name_the_path():
    m = NestedMap(a=NestedMap(b=1), t=(1, 2))
    with pytest.raises(ValueError, match=r"cannot set key 'c' in 'a.b', which is a int"):
        m.Set("a.b.c", 2)
    with pytest.raises(
        ValueError, match=r"cannot set index 0 in 't', which is a tuple, not a list"
    ):
        m.Set("t[0]", 2)
    with pytest.raises(ValueError, match=r"cannot set index 0 in 'a', which is a NestedMap"):
        m.Set("a[0]", 2)
    with pytest.raises(ValueError, match="'keys' is reserved"):
        m.Set("a.keys", 2)
    assert m == {"a": {"b": 1}, "t": (1, 2)}


# --- tf.nest and tf.function ---------------------------------------------------------


def _TensorSample() -> NestedMap:
    return NestedMap(
        w=tf.constant([[1.0, 2.0]]),
        b=NestedMap(scale=tf.constant(3.0), ids=[tf.constant([1, 2]), tf.constant([3])]),
    )


def test_tf_nest_flatten_and_pack_round_trip():
    m = _TensorSample()
    flat = tf.nest.flatten(m)
    assert [id(t) for t in flat] == [id(t) for t in m.Flatten()]
    assert [t.numpy().tolist() for t in flat] == [[1, 2], [3], 3.0, [[1.0, 2.0]]]
    packed = tf.nest.pack_sequence_as(m, flat)
    assert type(packed) is NestedMap and type(packed.b) is NestedMap
    assert packed.b.scale is m.b.scale
    # NestedMap.Pack accepts tf.nest's flat list and vice versa.
    assert tf.nest.flatten(m.Pack(flat)) == flat
    tf.nest.assert_same_structure(m, m.Pack(flat))


def test_tf_nest_map_structure_returns_nested_map():
    m = _TensorSample()
    doubled = tf.nest.map_structure(lambda t: t * 2, m)
    assert type(doubled) is NestedMap and type(doubled.b) is NestedMap
    np.testing.assert_allclose(doubled.w.numpy(), [[2.0, 4.0]])
    np.testing.assert_array_equal(doubled.b.ids[0].numpy(), [2, 4])
    summed = tf.nest.map_structure(lambda x, y: x + y, m, doubled)
    np.testing.assert_allclose(summed.b.scale.numpy(), 9.0)
    assert tf.nest.map_structure(lambda t: t, m).IsCompatible(m)


def test_tf_nest_matches_flatten_on_mixed_containers():
    m = _Sample()
    assert tf.nest.map_structure(lambda v: v + 1, m) == m.Transform(lambda v: v + 1)


def test_passes_through_tf_function_keeping_type():
    traced_types = []

    @tf.function
    def Step(inputs):
        traced_types.append((type(inputs), type(inputs.b)))
        out = NestedMap(y=tf.matmul(inputs.w, inputs.w, transpose_b=True) * inputs.b.scale)
        out.ids = inputs.b.ids
        out.extra = NestedMap(total=tf.add_n([tf.reduce_sum(t) for t in inputs.b.ids]))
        return out

    result = Step(_TensorSample())
    assert traced_types == [(NestedMap, NestedMap)]
    assert type(result) is NestedMap and type(result.extra) is NestedMap
    np.testing.assert_allclose(result.y.numpy(), [[15.0]])
    assert result.extra.total.numpy() == 6
    np.testing.assert_array_equal(result.ids[1].numpy(), [3])
    # Same structure and signatures: no retrace.
    Step(_TensorSample().Transform(lambda t: t + 1))
    assert Step.experimental_get_tracing_count() == 1


def test_tf_function_with_input_signature():
    spec = NestedMap(
        x=tf.TensorSpec([None], tf.float32), y=NestedMap(z=tf.TensorSpec([], tf.float32))
    )

    @tf.function(input_signature=[spec])
    def Scale(inputs):
        return inputs.Transform(lambda t: t * inputs.y.z)

    out = Scale(NestedMap(x=tf.constant([1.0, 2.0]), y=NestedMap(z=tf.constant(3.0))))
    assert type(out) is NestedMap and type(out.y) is NestedMap
    np.testing.assert_allclose(out.x.numpy(), [3.0, 6.0])
    np.testing.assert_allclose(out.y.z.numpy(), 9.0)
