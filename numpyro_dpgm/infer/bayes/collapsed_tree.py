r"""The collapsed release density along the junction tree: a Kalman-style pass, clique by clique.

Under the normal relaxation (:mod:`numpyro_dpgm.distributions.normal_cgm`, (1)) the deviations
of the clique tables from their mean, ``δn = n − Nμ(θ)``, form a linear-Gaussian tree: with
``S`` the separator of clique ``K`` and its parent, ``s`` a separator cell and ``r`` a residual
cell,

.. math::

    δn_K = M_K\, δn_S + G_K z_K, \qquad (M_K δn_S)(s, r) = δn_S(s)\, p(r \mid s), \qquad
    G_K = \bigoplus_s \sqrt{Nμ_S(s)}\, \operatorname{diag}(\sqrt{p_s})\,(I − \sqrt{p_s}
    \sqrt{p_s}^⊤),                                                                         \tag{1}

``z ∼ N(0, I)``, ``δn_S`` the projection of the parent's ``δn`` (zero at the root, whose
"separator" is the fixed total). Each released answer reads one clique:
``r_K = y_K − Q_K Nμ_K = Q_K δn_K + e_K`` with ``e_K ∼ N(0, V_K)``. The upward pass (leaves
first) carries the evidence of a subtree as an information pair ``(J, h)`` on a separator,
with its log normaliser ``c``: at ``K``,

.. math::

    J = Q_K^⊤ V_K^{-1} Q_K + \sum_{c} Π_c^⊤ J_c Π_c, \quad h = Q_K^⊤ V_K^{-1} r_K + \sum_c
    Π_c^⊤ h_c, \quad H = I + G^⊤ J G = L L^⊤,                                               \tag{2}

then ``z_K`` is integrated out (``F = L^{-1} G^⊤ J M``, ``f = L^{-1} G^⊤ h``):

.. math::

    J_S = M^⊤ J M − F^⊤ F, \quad h_S = M^⊤ h − F^⊤ f, \quad
    c_S = \sum_c c_c + \tfrac12 f^⊤ f − \sum_j \log L_{jj}.                                \tag{3}

At a root ``δn_S = 0``, so ``log p(y | θ, v) = Σ_{roots} c − ½ rᵀV⁻¹r − ½ Σ log 2πv_i``, the
log density of ``N(Q Nμ, Q NΣ Qᵀ + V)``, in ``Σ_K |K|³ / 3`` flops for the factors instead of
the ``k d²`` of forming the dense ``PᵀV⁻¹P`` (``P = Q L(θ)``, ``d = Σ_K |K|``). The density
needs only ``log det H`` and ``H⁻¹`` applied to a few vectors, and ``H`` is a diagonal plus a
low-rank matrix (:func:`_structured_message`), so :func:`tree_log_likelihood` (NUTS's target)
costs ``O(|K| m² + m³)`` per clique, ``m`` twice the separator's cells plus the answers that
read several cells and the children's separator cells; the draws keep the dense factors. The
downward pass (root first) draws the tables from their exact conditional given ``(θ, v, y)``:
``z_K = L^{-⊤}(f − F δn_S + ξ_K)``, ``ξ ∼ N(0, I)``, the forward-filtering, backward-sampling
of a linear-Gaussian chain on a tree.
Both passes use the deviations, so no term grows with ``N²``. JAX differentiates the pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import constraints

from ...distributions.normal_cgm import NormalTablesPlan, rows_to_network

__all__ = ["ReleaseTree", "TreeBlock", "TreeFunctions", "TreeReleaseNormal", "release_tree",
           "tree_answers", "tree_conditional_coordinates", "tree_functions",
           "tree_log_likelihood"]

Array = Any


class TreeBlock(NamedTuple):
    """The release's view of one junction-tree clique of the normal relaxation's plan.

    Attributes
    ----------
    parent : int
        Index of the parent block (``-1`` at the root).
    children : tuple of int
    to_sep : numpy int array ``(parent's cells,)``
        Per cell of the parent (its ``(s, r)`` order), the separator cell (this block's row)
        it lies in: ``Π`` of (2) as an index.
    answers : numpy int array
        The released answers that read this clique.
    read : numpy array ``(len(answers), rows * cols)``
        ``Q_K``: the answers as linear read-outs of the clique's ``(s, r)`` cells.
    cells : numpy int array or None
        Where every answer reads one cell (a table released in full): that cell, so that
        ``Q_Kᵀ V⁻¹ Q_K`` of (2) is diagonal; ``None`` otherwise.
    """

    parent: int
    children: tuple[int, ...]
    to_sep: np.ndarray
    answers: np.ndarray
    read: np.ndarray
    cells: np.ndarray | None


class ReleaseTree(NamedTuple):
    """:func:`release_tree`: a plan and, per block, what of the release it reads."""

    plan: NormalTablesPlan
    blocks: tuple[TreeBlock, ...]
    num_answers: int


def release_tree(plan: NormalTablesPlan, predict: Callable[[Array], Array]) -> ReleaseTree:
    """The tree of (2) for the answers ``predict(n)`` (linear in the network's tables ``n``).

    Raises
    ------
    ValueError
        If an answer reads the tables of two junction-tree cliques (a query across cliques):
        (2) assigns every answer to one clique.
    """
    net = plan.network
    flat = np.asarray(jax.jacfwd(lambda t: predict(rows_to_network(plan, t)))(
        jnp.zeros(plan.dim, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)))
    blocks, index = [], {b.clique: i for i, b in enumerate(plan.blocks)}
    owner = np.full(flat.shape[0], -1)
    for i, b in enumerate(plan.blocks):
        touches = np.any(flat[:, b.offset:b.offset + b.rows * b.cols] != 0, axis=1)
        both = touches & (owner >= 0)
        if np.any(both):
            a = int(np.flatnonzero(both)[0])
            raise ValueError(f"answer {a} reads the tables of {plan.blocks[owner[a]].clique} and "
                             f"{b.clique}; the collapsed path needs each answer to read one "
                             "junction-tree clique")
        owner[touches] = i
    owner[owner < 0] = 0  # answers that read no cell: constants, kept with the root
    for i, b in enumerate(plan.blocks):
        answers = np.flatnonzero(owner == i)
        read = flat[answers, b.offset:b.offset + b.rows * b.cols]
        parent = -1 if b.parent is None else index[b.parent]
        to_sep = np.zeros(0, int)
        if parent >= 0:
            p = plan.blocks[parent]
            shape = net.domain.shape_of(p.clique)
            cells = np.unravel_index(p.to_rows, shape)  # per (s, r) cell of the parent
            sep_axes = [p.clique.index(a) for a in b.sep]
            to_sep = (np.ravel_multi_index([cells[k] for k in sep_axes],
                                           [shape[k] for k in sep_axes])
                      if sep_axes else np.zeros(p.rows * p.cols, int))
        single = np.count_nonzero(read, axis=1) == 1
        cells = np.argmax(read != 0, axis=1) if np.all(single) else None
        blocks.append([parent, (), to_sep, answers, read, cells])
    for i, blk in enumerate(blocks):
        if blk[0] >= 0:
            blocks[blk[0]][1] += (i,)
    return ReleaseTree(plan, tuple(TreeBlock(*b) for b in blocks), int(flat.shape[0]))


def _spread_t(p: Array, scale: Array, x: Array) -> Array:
    """``Gᵀ x`` of (1) for ``x`` of shape ``(rows * cols, m)``: per row
    ``a_s (√p_s ⊙ x_s − √p_s (p_sᵀ x_s))``."""
    rows, cols = p.shape
    x = x.reshape(rows, cols, -1)
    q = jnp.sqrt(p)[..., None]
    out = q * x - q * jnp.sum(p[..., None] * x, axis=1, keepdims=True)
    return (scale[..., None] * out).reshape(rows * cols, -1)


def _spread(p: Array, scale: Array, z: Array) -> Array:
    """``G z`` of (1): per row ``a_s √p_s ⊙ (z_s − √p_s (√p_sᵀ z_s))``."""
    rows, cols = p.shape
    z = z.reshape(rows, cols)
    q = jnp.sqrt(p)
    return (scale * q * (z - q * jnp.sum(q * z, axis=1, keepdims=True))).reshape(-1)


def _dense_message(b: Any, p: Array, scale: Array, info: Array, shift: Array,
                   ) -> tuple[Array, Array, Array, tuple]:
    """(2)–(3) at one block with the information ``J`` as a dense ``|K| × |K|`` matrix:
    ``(J_S, h_S, c_S − Σ c_c)`` and the factors ``(L, F, f)`` of the downward pass."""
    size = b.rows * b.cols
    gt_info = _spread_t(p, scale, info)  # Gᵀ J
    h_mat = jnp.eye(size, dtype=info.dtype) + _spread_t(p, scale, gt_info.T)
    chol = jnp.linalg.cholesky(0.5 * (h_mat + h_mat.T))
    # J M and Gᵀ J M: M sums a row's cells weighted by p(r | s)
    info_m = jnp.einsum("ksr,sr->ks", info.reshape(size, b.rows, b.cols), p)
    f_mat = solve_triangular(chol, _spread_t(p, scale, info_m), lower=True)  # F = L⁻¹GᵀJM
    f_vec = solve_triangular(chol, _spread_t(p, scale, shift[:, None])[:, 0], lower=True)
    m_info_m = jnp.einsum("sr,srt->st", p, info_m.reshape(b.rows, b.cols, b.rows))
    j_s = m_info_m - f_mat.T @ f_mat
    h_s = jnp.sum(p * shift.reshape(b.rows, b.cols), axis=1) - f_mat.T @ f_vec
    const = 0.5 * f_vec @ f_vec - jnp.sum(jnp.log(jnp.diagonal(chol)))
    return j_s, h_s, const, (chol, f_mat, f_vec)


def _structured_message(b: Any, p: Array, scale: Array, diag: Array, shift: Array,
                        spread: np.ndarray, child_info: Array) -> tuple[Array, Array, Array]:
    r"""(2)–(3) at one block, without a ``|K| × |K|`` matrix.

    There ``J = D + U W Uᵀ``: ``D`` diagonal (``Q_Kᵀ V⁻¹ Q_K`` of the answers that read one
    cell each), ``U`` (``spread``) the read-outs of the answers that read several cells and the
    indicators of the children's separator cells, ``W`` (``child_info``) block-diagonal, their
    inverse noise variances and the children's messages ``J_c``. Per
    separator row ``s`` (``G_s = a_s (diag √p − p √pᵀ)``, ``d = D_s``)
    ``G_sᵀ D_s G_s = a_s² (diag(p d) − u √pᵀ − √p uᵀ + κ √p √pᵀ)``, ``u = d p^{3/2}``,
    ``κ = Σ d p²``: a diagonal plus rank two. So ``H = Δ + E Ω Eᵀ`` with ``Δ`` diagonal,
    ``E = [u_s, √p_s (per row), GᵀU]`` of ``m = 2·rows + r`` columns and ``Ω`` block-diagonal,
    and by the matrix determinant lemma and Woodbury's identity (in the form that does not
    invert ``Ω``, which may be singular), with ``C = I + Ω EᵀΔ⁻¹E``,

    .. math::

        \log\det H = \sum \log Δ + \log\det C, \qquad
        H^{-1} = Δ^{-1} − Δ^{-1} E\, C^{-1} Ω\, E^⊤ Δ^{-1},

    in ``O(|K| m² + m³)`` flops instead of ``|K|³``. Returns ``(J_S, h_S, c_S − Σ c_c)``.
    """
    rows, cols = b.rows, b.cols
    size = rows * cols
    a2 = (scale**2).reshape(rows, 1)
    d = diag.reshape(rows, cols)
    delta = (1.0 + a2 * p * d).reshape(-1)
    q = jnp.sqrt(p)
    u = d * p * q
    kappa = jnp.sum(d * p * p, axis=1)
    # E's per-row columns (u_s, √p_s) laid out as (|K|, rows, 2), then flattened
    eye_rows = jnp.eye(rows, dtype=p.dtype)
    e_rows = jnp.stack([u[:, :, None] * eye_rows[:, None, :],
                        q[:, :, None] * eye_rows[:, None, :]], axis=-1).reshape(size, 2 * rows)
    core_rows = (a2[:, 0, None, None] * jnp.stack([
        jnp.stack([jnp.zeros_like(kappa), -jnp.ones_like(kappa)], axis=-1),
        jnp.stack([-jnp.ones_like(kappa), kappa], axis=-1)], axis=-2))  # (rows, 2, 2)
    core = jax.scipy.linalg.block_diag(*core_rows) if rows > 1 else core_rows[0]
    m_mat = (p[:, :, None] * eye_rows[:, None, :]).reshape(size, rows)  # M: (|K|, rows)
    if spread.shape[1]:
        u_mat = jnp.asarray(spread, p.dtype)
        # U's columns are given in the clique's (s, r) order, as the block's cells
        y_mat = _spread_t(p, scale, u_mat)  # Gᵀ U
        e_mat = jnp.concatenate([e_rows, y_mat], axis=1)
        core = jax.scipy.linalg.block_diag(core, child_info)
        j_m = diag[:, None] * m_mat + u_mat @ (child_info @ (u_mat.T @ m_mat))
    else:
        e_mat = e_rows
        j_m = diag[:, None] * m_mat
    x = _spread_t(p, scale, jnp.concatenate([j_m, shift[:, None]], axis=1))  # Gᵀ [JM, h]
    e_scaled = e_mat / delta[:, None]
    capacitance = jnp.eye(core.shape[0], dtype=p.dtype) + core @ (e_mat.T @ e_scaled)
    ex = e_scaled.T @ x
    quad = x.T @ (x / delta[:, None]) - ex.T @ jnp.linalg.solve(capacitance, core @ ex)
    quad = 0.5 * (quad + quad.T)
    _, logdet_c = jnp.linalg.slogdet(capacitance)
    m_h = jnp.concatenate([j_m, shift[:, None]], axis=1)
    mjm = m_mat.T @ m_h  # Mᵀ [JM, h]
    j_s = mjm[:, :rows] - quad[:rows, :rows]
    h_s = mjm[:, rows] - quad[:rows, rows]
    const = 0.5 * quad[rows, rows] - 0.5 * (jnp.sum(jnp.log(delta)) + logdet_c)
    return 0.5 * (j_s + j_s.T), h_s, const


#: The forms of (2)–(3) at a block: ``"low_rank"`` (:func:`_structured_message`: ``C``,
#: ``m × m``) and ``"dense"`` (a Cholesky factor of ``H``, ``|K| × |K|``, kept for the draws).
MESSAGE_FORMS = ("low_rank", "dense")


def _upward(tree: ReleaseTree, conditionals: list, total: Array, residual: Array,
            variance: Array, form: str = "dense") -> tuple[Array, list]:
    """(2)–(3) from the leaves in ``form`` (:data:`MESSAGE_FORMS`): the roots' ``c`` summed,
    and per block ``(L, F, f)`` where the block took the dense form (else ``None``)."""
    plan = tree.plan
    messages: list = [None] * len(plan.blocks)
    saved: list = [None] * len(plan.blocks)
    for i in reversed(range(len(plan.blocks))):
        b, tb = plan.blocks[i], tree.blocks[i]
        mu_s, p = conditionals[i]
        size = b.rows * b.cols
        read = jnp.asarray(tb.read, residual.dtype)
        precision = 1.0 / variance[tb.answers]
        shift = read.T @ (residual[tb.answers] * precision)
        const = jnp.zeros((), residual.dtype)
        for j in tb.children:
            shift = shift + messages[j][1][tree.blocks[j].to_sep]
            const = const + messages[j][2]
        scale = jnp.sqrt(total * mu_s)  # (rows, 1)
        if form == "low_rank":
            # single-cell answers give J's diagonal; answers that read several cells (a
            # marginal, a query) and the children's messages its low-rank part U W Uᵀ
            single = np.count_nonzero(tb.read, axis=1) == 1
            spread = np.concatenate([tb.read[~single].T, _child_indicators(tree, i)], axis=1)
            cells = np.argmax(tb.read[single] != 0, axis=1)
            coef = read[np.flatnonzero(single), cells]
            diag = jax.ops.segment_sum(coef**2 * precision[single], cells, num_segments=size)
            info_low = jax.scipy.linalg.block_diag(
                jnp.diag(precision[~single]), *[messages[j][0] for j in tb.children])
            j_s, h_s, c_s = _structured_message(b, p, scale, diag, shift, spread, info_low)
        else:
            if tb.cells is not None:
                coef = read[np.arange(len(tb.cells)), tb.cells]
                info = jnp.diag(jax.ops.segment_sum(coef**2 * precision, tb.cells,
                                                    num_segments=size))
            else:
                info = (read.T * precision) @ read
            for j in tb.children:
                idx = tree.blocks[j].to_sep
                info = info + messages[j][0][idx][:, idx]
            j_s, h_s, c_s, saved[i] = _dense_message(b, p, scale, info, shift)
        messages[i] = (j_s, h_s, const + c_s)
    roots = [messages[i][2] for i, tb in enumerate(tree.blocks) if tb.parent < 0]
    return sum(roots[1:], roots[0]), saved


def _child_indicators(tree: ReleaseTree, i: int) -> np.ndarray:
    """``U`` of :func:`_structured_message`: per cell of block ``i`` (its ``(s, r)`` order),
    the indicator of the separator cell of each child it lies in, ``(|K|, Σ_c |S_c|)``."""
    b = tree.plan.blocks[i]
    columns = []
    for j in tree.blocks[i].children:
        to_sep = tree.blocks[j].to_sep
        columns.append(np.eye(tree.plan.blocks[j].rows)[to_sep])
    return (np.concatenate(columns, axis=1) if columns
            else np.zeros((b.rows * b.cols, 0)))


def tree_log_likelihood(tree: ReleaseTree, conditionals: list, total: Array, residual: Array,
                        variance: Array, form: str = "low_rank") -> Array:
    r"""``log N(r; 0, Q NΣ(θ) Qᵀ + diag v)`` by the upward pass (2)–(3).

    Parameters
    ----------
    tree : ReleaseTree
    conditionals : list
        Per block ``(μ_S, p(r | s))`` at ``θ`` (as :func:`~numpyro_dpgm.distributions.
        normal_cgm.normal_tables` takes them).
    total : float
        ``N``.
    residual : array ``(answers,)``
        ``r = y − Q Nμ(θ)`` (:func:`tree_answers`).
    variance : array ``(answers,)``
        The noise variances ``v``.
    form : {"low_rank", "dense"}
        How each block's message is computed (:data:`MESSAGE_FORMS`): ``"low_rank"``
        (default) by the diagonal-plus-low-rank form of :func:`_structured_message`
        (``O(|K| m² + m³)``), ``"dense"`` by a Cholesky factor of ``H`` (``|K|³``), as the
        draws' pass does.

    Returns
    -------
    scalar array
    """
    if form not in MESSAGE_FORMS:
        raise ValueError(f"form must be one of {MESSAGE_FORMS}, not {form!r}")
    root, _ = _upward(tree, conditionals, total, residual, variance, form)
    return root - 0.5 * (jnp.sum(residual**2 / variance)
                         + jnp.sum(jnp.log(2.0 * jnp.pi * variance)))


def _downward(tree: ReleaseTree, conditionals: list, total: Array,
              draw: Callable[[int, Array], Array]) -> tuple[list, list]:
    """From the root: per block ``z_K = draw(K, δn_S)`` and ``δn_K = M δn_S + G z_K`` (1)."""
    plan = tree.plan
    zs: list = []
    dev: list = []
    for i, b in enumerate(plan.blocks):
        tb = tree.blocks[i]
        mu_s, p = conditionals[i]
        sep = (jnp.zeros(b.rows, p.dtype) if tb.parent < 0
               else jax.ops.segment_sum(dev[tb.parent], tb.to_sep, num_segments=b.rows))
        zs.append(draw(i, sep))
        dev.append((sep[:, None] * p).reshape(-1) + _spread(p, jnp.sqrt(total * mu_s), zs[i]))
    return zs, dev


def tree_conditional_coordinates(tree: ReleaseTree, conditionals: list, total: Array,
                                 residual: Array, variance: Array, xi: Array) -> Array:
    """A draw of the normal relaxation's ``z`` from its conditional given ``(θ, v, y)``: the
    upward pass, then ``z_K = L^{-⊤}(f − F δn_S + ξ_K)`` from the root.

    Parameters
    ----------
    tree, conditionals, total, residual, variance :
        As :func:`tree_log_likelihood`.
    xi : array ``(plan.dim,)``
        Standard normal draws (``ξ``), laid out as ``z``.

    Returns
    -------
    array ``(plan.dim,)``
        ``z``: :func:`~numpyro_dpgm.distributions.normal_cgm.normal_tables` maps it to ``n``.
    """
    blocks = tree.plan.blocks
    _, saved = _upward(tree, conditionals, total, residual, variance)

    def draw(i: int, sep: Array) -> Array:
        chol, f_mat, f_vec = saved[i]
        b = blocks[i]
        return solve_triangular(chol.T, f_vec - f_mat @ sep + xi[b.offset:b.offset + b.rows
                                                                 * b.cols], lower=False)

    return jnp.concatenate(_downward(tree, conditionals, total, draw)[0])


def tree_answers(tree: ReleaseTree, conditionals: list, total: Array,
                 z: Array | None = None) -> Array:
    """``Q n``: the noise-free answers of the tables at ``z`` (``None``: at their mean,
    ``Q Nμ(θ)``)."""
    out = jnp.zeros(tree.num_answers, conditionals[0][1].dtype)
    dev = None
    if z is not None:
        blocks = tree.plan.blocks
        dev = _downward(tree, conditionals, total, lambda i, sep: z[
            blocks[i].offset:blocks[i].offset + blocks[i].rows * blocks[i].cols])[1]
    for i, (tb, (mu_s, p)) in enumerate(zip(tree.blocks, conditionals, strict=True)):
        table = (total * mu_s * p).reshape(-1)
        if dev is not None:
            table = table + dev[i]
        out = out.at[tb.answers].set(jnp.asarray(tb.read) @ table)
    return out


class TreeFunctions(NamedTuple):
    """One tree's passes at a fixed ``N`` (:func:`tree_functions`).

    Attributes
    ----------
    answers : callable
        ``answers(conditionals)``: :func:`tree_answers` at the tables' mean.
    log_likelihood : callable
        ``log_likelihood(conditionals, residual, variance)``: :func:`tree_log_likelihood`.
    coordinates : callable
        ``coordinates(conditionals, residual, variance, xi)``:
        :func:`tree_conditional_coordinates`.
    """

    answers: Callable
    log_likelihood: Callable
    coordinates: Callable


def tree_functions(tree: ReleaseTree, total: float, compiled: bool = True) -> TreeFunctions:
    """The passes of ``tree`` at ``N = total``, each one compiled program (``compiled=False``:
    plain functions).

    Inside a compiled program (a sampler's step) the two are the same; outside one, NumPyro's
    set-up (``initialize_model``, a kernel's ``init``) evaluates a model and its gradient op by
    op, and each of the passes' thousands of small operations is compiled on its own: on Adult's
    842-cell tree that set-up took 50–100 s, where a compiled pass is compiled once.
    """
    fns = TreeFunctions(
        lambda conds: tree_answers(tree, conds, total),
        lambda conds, r, v: tree_log_likelihood(tree, conds, total, r, v),
        lambda conds, r, v, xi: tree_conditional_coordinates(tree, conds, total, r, v, xi))
    return TreeFunctions(*map(jax.jit, fns)) if compiled else fns


class TreeReleaseNormal(dist.Distribution):
    """The answers' law given ``(θ, v)`` with the tables integrated out:
    ``N(Q Nμ, Q NΣ Qᵀ + diag v)``, its density by the upward pass (2)–(3).

    Parameters
    ----------
    tree : ReleaseTree
    conditionals : list
        Per block ``(μ_S, p(r | s))``.
    total : float
        ``N``.
    cov_diag : array ``(answers,)``
        The noise variances ``v``.
    functions : TreeFunctions, optional
        The tree's passes at ``total`` (:func:`tree_functions`: compiled, which spares NumPyro's
        set-up compiling them op by op); default plain ones.
    """

    arg_constraints = {"loc": constraints.real_vector, "cov_diag": constraints.positive}
    support = constraints.real_vector
    reparametrized_params = ["loc", "cov_diag"]

    def __init__(self, tree: ReleaseTree, conditionals: list, total: Array, cov_diag: Array, *,
                 functions: TreeFunctions | None = None, validate_args: bool | None = None):
        self.tree, self.conditionals, self.total = tree, conditionals, total
        self.functions = (tree_functions(tree, total, compiled=False) if functions is None
                          else functions)
        self.loc = self.functions.answers(conditionals)
        self.cov_diag = jnp.broadcast_to(cov_diag, self.loc.shape)
        super().__init__(batch_shape=(), event_shape=self.loc.shape,
                         validate_args=validate_args)

    def sample(self, key: Array, sample_shape: tuple = ()) -> Array:
        k_z, k_e = jax.random.split(key)
        shape = tuple(sample_shape)
        z = jax.random.normal(k_z, (math.prod(shape), self.tree.plan.dim), self.loc.dtype)
        answers = jax.vmap(lambda x: tree_answers(self.tree, self.conditionals, self.total,
                                                  x))(z).reshape(shape + self.loc.shape)
        e = jax.random.normal(k_e, shape + self.loc.shape, self.loc.dtype)
        return answers + e * jnp.sqrt(self.cov_diag)

    def log_prob(self, value: Array) -> Array:
        return self.functions.log_likelihood(self.conditionals, value - self.loc, self.cov_diag)

    @property
    def mean(self) -> Array:
        return self.loc
