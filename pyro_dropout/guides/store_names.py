"""The names a guide's parameters take in Pyro's global param store, and what a guide does
with entries it finds there when it sets up.

Pyro keeps a ``PyroModule`` guide's parameters in one global store under
``"<guide name>.<group>.<site>"`` (e.g. ``"AutoMeanField.locs.net.layers.0.weight"``), and a
guide that finds an entry of its own name there uses it instead of its initial value. That is
how ``pyro.get_param_store().load(path)`` restores a fit in a new process, and it is also how a
second guide of one class in a session would silently start from (and then train) the first's
parameters. So the name must be the same in every process (it is the class name, or the
guide's ``name=``) while two live guides must never share one. When a guide sets up:

* a live guide (one still referenced) holds the name and its parameters are in the store: a
  guide with an explicit ``name=`` raises; a guide with the default name takes
  ``"<Class>_1"``, ``"<Class>_2"``, ... and warns that this name depends on the session;
* entries of its name left by an earlier guide of this process that is gone (e.g. a notebook
  cell run twice) are replaced: the new guide starts from its initialisation, as in a new
  process;
* other entries of its name (loaded from a file, or set by the user) are used, and must be
  exactly the names and shapes this guide creates; otherwise, or when there are none but the
  store holds this class's parameters under other default names (``"<Class>_1..."``), it
  raises, listing what it found and what it expected.

Each name has one owner, the guide that last set up (or was used) under it. A guide used
while another owns its name (it was loaded with ``torch.load`` or copied while the original is
live, or ``pyro.clear_param_store()`` ran and a new guide took the name) raises instead of
silently adopting the other's parameters; if the owner is gone, it takes the name back with its
own values. Telling "gone" from "live" may need the cycle collector (``gc.collect()``), which
runs only when there is such a conflict.

With ``pyro.settings.set(module_local_params=True)`` each module keeps its own parameters and
none of this applies.
"""

import gc
import re
import warnings
import weakref
from typing import Any

import pyro

__all__ = ["StoreNames", "claim", "owns", "store_in_use"]

#: Param-store entries that a guide of this process created or used: full name -> the tensor.
#: An entry whose tensor is still the one recorded here, and whose guide is gone, is a leftover.
_MADE: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
#: name -> (weak reference to) the guide that owns it in this process.
_OWNER: dict[str, weakref.ReferenceType[Any]] = {}

_SHOW = 6  # names listed in a message


def store_in_use():
    """False with Pyro's module-local parameters (no global store to share)."""
    return not pyro.settings.get("module_local_params")


def full_names(guide):
    """``{store name: unconstrained parameter}`` of a set-up guide."""
    # From the module's own tensors: PyroModule.named_pyro_params would read each PyroParam,
    # which inside a model run adopts the store's entry of that name (the thing decided here).
    suffix = "_unconstrained"
    return {
        f"{guide._pyro_name}.{n[: -len(suffix)]}": p
        for n, p in guide.named_parameters()
        if n.endswith(suffix)
    }


def _under(prefix, keys):
    return {k for k in keys if k.startswith(prefix + ".")}


def _other_owner(name, guide):
    """A weak reference to the live guide other than ``guide`` that owns ``name``, or None."""
    ref = _OWNER.get(name)
    if ref is None or ref() is None or ref() is guide:
        return None
    return ref


def _still_alive(ref):
    # A guide that is no longer referenced may survive until the cycle collector runs (the
    # compiled loss holds it in a reference cycle): collect before deciding. No strong
    # reference is held here while collecting.
    gc.collect()
    return ref() is not None


def _taken(name, guide, params):
    """Whether a live guide other than ``guide`` owns ``name`` with its parameters in the
    store (one whose entries were cleared from the store gives the name up: it raises if it
    is used again, see :func:`claim`)."""
    ref = _other_owner(name, guide)
    if ref is None:
        return False
    if not any(params.get(k) is t for k, t in full_names(ref()).items()):
        return False
    return _still_alive(ref)


def _is_leftover(key, params):
    return _MADE.get(key) is params[key]


def _listing(names):
    names = sorted(names)
    shown = ", ".join(names[:_SHOW])
    return shown + (f", ... ({len(names)} names)" if len(names) > _SHOW else "")


def owns(guide):
    """Whether ``guide`` owns its name in this process (checked at each use: cheap)."""
    ref = _OWNER.get(guide._pyro_name)
    return ref is not None and ref() is guide


def register(guide):
    """Record that ``guide`` owns its name and its tensors in this process."""
    params = dict(pyro.get_param_store().named_parameters())
    for key, p in full_names(guide).items():
        _MADE[key] = params.get(key, p)
    _OWNER[guide._pyro_name] = weakref.ref(guide)


class StoreNames:
    """The name a guide takes as it sets up, and the store entries it finds there.

    Created at the start of the set-up (it chooses ``guide._pyro_name`` and removes leftovers);
    :meth:`check` at its end compares what the guide adopted with what it expected;
    :meth:`restore` puts back the entries a failed set-up removed."""

    def __init__(self, guide, requested):
        self.guide = guide
        cls = type(guide).__name__
        store = pyro.get_param_store()
        keys = set(store.keys())
        params = dict(store.named_parameters())
        base = requested if requested is not None else cls
        name, k = base, 0
        while _taken(name, guide, params):
            if requested is not None:
                raise ValueError(
                    f"{cls}(name={requested!r}): another live guide already stores its "
                    f"parameters under {requested!r} in Pyro's param store; the two would "
                    "share (and train) one set of parameters. Give each guide its own name=, "
                    "or delete the other guide first (del guide)."
                )
            k += 1
            name = f"{base}_{k}"
        if name != base:
            warnings.warn(
                f"{cls}: another live {cls} already stores its parameters under {base!r} in "
                f"Pyro's param store, so this one uses {name!r} (neither starts from or moves "
                f"the other's). A name that depends on how many guides a session built does "
                f"not survive pyro.get_param_store().save/load: give each guide its own name= "
                f"(e.g. {cls}(model, name='fit_b')), or delete the other guide first.",
                stacklevel=5,
            )
        guide._pyro_name = name
        params = dict(store.named_parameters())
        for key in _under(name, keys):
            if _is_leftover(key, params):
                del store[key]  # an earlier guide's, now gone: start afresh
        self.keys = set(store.keys())
        self.found = _under(name, self.keys)
        state = store.get_state()
        self.saved = {
            part: {k: v for k, v in state[part].items() if k in self.found} for part in state
        }
        #: store name -> shape the guide initialises it with (filled by the guide's _set)
        self.shapes = {}

    def check(self):
        """Raise if the entries found under the guide's name are not exactly its parameters,
        or if there were none while the store holds this class's parameters under other
        default names; then register the guide."""
        guide, cls = self.guide, type(self.guide).__name__
        name = guide._pyro_name
        store = pyro.get_param_store()
        expected = set(full_names(guide))
        fix = (
            "Build the same model (architecture, priors) and guide class as the saved fit, or "
            "call pyro.clear_param_store() (or del pyro.get_param_store()[key]) to start afresh."
        )
        if self.found:
            wrong = {
                k: (tuple(store[k].shape), tuple(s))
                for k, s in self.shapes.items()
                if k in self.found and store[k].shape != s
            }
            if self.found != expected or wrong:
                missing, extra = expected - self.found, self.found - expected
                parts = [
                    f"{cls} (name {name!r}): Pyro's param store holds parameters under this "
                    f"guide's name that do not match it."
                ]
                if missing:
                    parts.append(f"Missing: {_listing(missing)}.")
                if extra:
                    parts.append(f"Not this guide's: {_listing(extra)}.")
                if wrong:
                    shown = sorted(wrong.items())[:_SHOW]
                    parts.append(
                        "Shapes (stored vs this guide's): "
                        + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in shown)
                        + "."
                    )
                parts.append(fix)
                raise RuntimeError(" ".join(parts))
        else:
            pattern = re.compile(rf"{re.escape(cls)}(_\d+)?\.")
            params = dict(store.named_parameters())
            candidates = {k for k in self.keys if pattern.match(k) and not _is_leftover(k, params)}

            def unclaimed():
                live = {n for n in list(_OWNER) if _other_owner(n, guide) is not None}
                return {k for k in candidates if pattern.match(k).group(0)[:-1] not in live}

            others = unclaimed()
            if others != candidates:  # a guide no longer referenced may await the collector
                gc.collect()
                others = unclaimed()
            if others:
                prefixes = sorted({pattern.match(k).group(0)[:-1] for k in others})
                raise RuntimeError(
                    f"{cls} (name {name!r}) found none of its parameters in Pyro's param store, "
                    f"which holds parameters of a {cls} under other names: it would ignore "
                    f"them and predict from its initialisation. Found: {_listing(others)}. "
                    f"Expected: {_listing(expected)}. If they are this guide's fitted "
                    f"parameters (a session that built several {cls} guides numbers their "
                    f"names), construct it with name={prefixes[0]!r}. {fix}"
                )
        register(guide)

    def restore(self):
        """Put back the entries found under the guide's name (a failed set-up removes them)."""
        if any(self.saved.values()):
            pyro.get_param_store().set_state(self.saved)


def claim(guide):
    """Use of a guide that does not own its name: one set up elsewhere (``torch.load``,
    ``copy.deepcopy``), or one whose name another guide took after ``pyro.clear_param_store()``.
    If another live guide owns the name it raises; otherwise the guide's own values replace the
    store's entries of its names (with a warning where they held other values, e.g. a loaded
    store)."""
    cls, name = type(guide).__name__, guide._pyro_name
    ref = _other_owner(name, guide)
    if ref is not None and _still_alive(ref):
        raise RuntimeError(
            f"{cls} (name {name!r}): another live guide now stores its parameters under "
            f"{name!r} in Pyro's param store (this guide was loaded or copied while that one "
            "is live, or pyro.clear_param_store() ran and that one set up after this one); "
            "the two would share (and train) one set of parameters. Give each guide its own "
            "name= (load a saved state_dict into a guide built with another name), or delete "
            "the other guide first (del guide)."
        )
    store = pyro.get_param_store()
    params = dict(store.named_parameters())
    replaced = []
    for key, p in full_names(guide).items():
        if key in params and params[key] is not p:
            stored = params[key]
            same = stored.shape == p.shape and bool((stored.detach() == p.detach()).all())
            if not same and not _is_leftover(key, params):
                replaced.append(key)
            del store[key]  # Pyro puts the guide's own tensor back at its next use
    if replaced:
        warnings.warn(
            f"{cls} (name {name!r}): Pyro's param store held other values under this guide's "
            f"names ({_listing(replaced)}); this guide was loaded or copied with its own "
            "values, which replace them.",
            stacklevel=4,
        )
    register(guide)
