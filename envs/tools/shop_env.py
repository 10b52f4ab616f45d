"""``turngym/ToolShop-v0``: a small retail back office in the tau-bench style.

A user asks for something (cancel an order, change its address, refund it); the
agent has tools over a database of users, products and orders and a policy to
follow.  Reward is 1 only when, at the agent's ``<answer>``, the database equals
the gold database (the task's correct operations applied to the initial one):
doing the wrong thing, too much, or nothing all score 0.  Databases and tasks are
generated offline from the task number, so replay is deterministic.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Literal

from .base import ToolEnv
from .schema import ToolSet, tool

POLICY = ("You are a retail support agent. Policy: identify the user with find_user before "
          "touching an order, and only act on that user's orders. Only 'pending' orders can be "
          "cancelled or have their address changed; only 'delivered' orders can be refunded. "
          "Do exactly what the user asks, nothing more. When done, reply <answer> done "
          "</answer>.")

_FIRST = ["Ada", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kai", "Liv"]
_LAST = ["Stone", "Marsh", "Reed", "Hale", "Frost", "Lane", "Moss", "Vale", "Wren", "Yew"]
_STREETS = ["Oak St", "Elm Rd", "Pine Ave", "Birch Ln", "Cedar Ct", "Maple Way"]
_PRODUCTS = ["lamp", "kettle", "backpack", "headphones", "desk", "chair", "mug", "blender"]


def generate_db(rng: random.Random) -> dict:
    users = {}
    for i, name in enumerate(rng.sample([f"{f} {s}" for f in _FIRST for s in _LAST], 6)):
        users[f"u{i}"] = {"name": name, "address": f"{rng.randint(1, 99)} {rng.choice(_STREETS)}"}
    products = {f"p{i}": {"name": n, "price": round(rng.uniform(5, 200), 2)}
                for i, n in enumerate(_PRODUCTS)}
    orders = {}
    for k in range(14):
        uid = f"u{k % 6}"
        items = [{"product": p, "qty": rng.randint(1, 3)} for p in rng.sample(sorted(products), 2)]
        orders[f"#W{1000 + k}"] = {"user": uid, "items": items,
                                   "status": rng.choice(["pending", "pending", "delivered"]),
                                   "address": users[uid]["address"], "refund": 0.0}
    return {"users": users, "products": products, "orders": orders}


def order_total(db: dict, oid: str) -> float:
    o = db["orders"][oid]
    return round(sum(db["products"][i["product"]]["price"] * i["qty"] for i in o["items"]), 2)


def _oid(order_id: str) -> str:
    """Order ids are matched without spaces and case ("# w1003" is "#W1003")."""
    return "".join(order_id.split()).upper()


def make_tools(db: dict) -> ToolSet:
    """Tools bound to one database (mutated in place)."""

    @tool
    def find_user(name: str) -> str:
        """Finds a user id by full name.

        Args:
            name: the user's full name, e.g. "Ada Stone"
        """
        for uid, u in db["users"].items():
            if " ".join(u["name"].lower().split()) == " ".join(name.lower().split()):
                return uid
        return f"Error: no user named {name!r}"

    @tool
    def list_orders(user_id: str) -> str:
        """Lists a user's orders with their status (oldest first).

        Args:
            user_id: id returned by find_user
        """
        user_id = user_id.strip().lower()
        if user_id not in db["users"]:
            return f"Error: unknown user {user_id!r}"
        return json.dumps({oid: o["status"] for oid, o in db["orders"].items()
                           if o["user"] == user_id})

    @tool
    def get_order(order_id: str) -> str:
        """Shows an order: user, items, status, address, total.

        Args:
            order_id: e.g. "#W1003"
        """
        order_id = _oid(order_id)
        if order_id not in db["orders"]:
            return f"Error: unknown order {order_id!r}"
        return json.dumps({**db["orders"][order_id], "total": order_total(db, order_id)})

    @tool
    def cancel_order(order_id: str, reason: Literal["no longer needed", "ordered by mistake"]
                     ) -> str:
        """Cancels a pending order.

        Args:
            order_id: the order to cancel
            reason: why the user cancels
        """
        order_id = _oid(order_id)
        o = db["orders"].get(order_id)
        if o is None:
            return f"Error: unknown order {order_id!r}"
        if o["status"] != "pending":
            return f"Error: order {order_id} is {o['status']}; only pending orders can be cancelled"
        o["status"], o["cancel_reason"] = "cancelled", reason
        return f"order {order_id} cancelled"

    @tool
    def change_address(order_id: str, address: str) -> str:
        """Changes the shipping address of a pending order.

        Args:
            order_id: the order to change
            address: the new address
        """
        order_id = _oid(order_id)
        o = db["orders"].get(order_id)
        if o is None:
            return f"Error: unknown order {order_id!r}"
        if o["status"] != "pending":
            return f"Error: order {order_id} is {o['status']}; only pending orders can change address"
        o["address"] = address.strip()
        return f"address of {order_id} set to {o['address']}"

    @tool
    def refund_order(order_id: str) -> str:
        """Refunds a delivered order in full.

        Args:
            order_id: the order to refund
        """
        order_id = _oid(order_id)
        o = db["orders"].get(order_id)
        if o is None:
            return f"Error: unknown order {order_id!r}"
        if o["status"] != "delivered":
            return f"Error: order {order_id} is {o['status']}; only delivered orders can be refunded"
        o["status"], o["refund"] = "refunded", order_total(db, order_id)
        return f"refunded {o['refund']:.2f} for {order_id}"

    return ToolSet([find_user, list_orders, get_order, cancel_order, change_address,
                    refund_order])


def make_task(index: int) -> tuple[dict, str, list[tuple[str, dict]]]:
    """(initial db, user request, gold call sequence)."""
    rng = random.Random(index * 104729 + 3)
    db = generate_db(rng)
    # train tasks have even indices, test tasks odd ones: the kind follows index // 2 so
    # that both splits hold every kind
    kind = ["cancel", "address", "refund", "cancel_latest"][(index // 2) % 4]
    want = "delivered" if kind == "refund" else "pending"
    choices = sorted(oid for oid, o in db["orders"].items() if o["status"] == want)
    if not choices:  # regenerate deterministically until the task is possible
        return make_task(index + 4 * 1000)
    oid = rng.choice(choices)
    uid = db["orders"][oid]["user"]
    name = db["users"][uid]["name"]
    calls: list[tuple[str, dict]] = [("find_user", {"name": name})]
    if kind == "cancel":
        reason = rng.choice(["no longer needed", "ordered by mistake"])
        text = f"Hi, I'm {name}. Please cancel order {oid}, the reason: {reason}."
        calls.append(("cancel_order", {"order_id": oid, "reason": reason}))
    elif kind == "address":
        addr = f"{rng.randint(100, 999)} {rng.choice(_STREETS)}"
        text = f"Hi, I'm {name}. Please ship order {oid} to {addr} instead."
        calls.append(("change_address", {"order_id": oid, "address": addr}))
    elif kind == "refund":
        text = f"Hi, I'm {name}. Order {oid} arrived and I want a refund."
        calls.append(("refund_order", {"order_id": oid}))
    else:
        mine = [o for o, v in db["orders"].items() if v["user"] == uid and v["status"] == "pending"]
        oid = mine[-1]
        text = (f"Hi, I'm {name}. Please cancel my most recent pending order; I no longer "
                "need it.")
        calls += [("list_orders", {"user_id": uid}),
                  ("cancel_order", {"order_id": oid, "reason": "no longer needed"})]
    return db, text, calls


class ToolShopEnv(ToolEnv):
    instructions = POLICY

    def __init__(self, split: str = "train", max_turns: int = 8, **kw):
        super().__init__(max_turns=max_turns, **kw)
        if split not in ("train", "test"):
            raise ValueError("split must be 'train' or 'test'")
        self.split = split
        self.index, self.db, self.gold_db, self.request, self.gold_calls = 0, {}, {}, "", []
        self._tools: ToolSet | None = None

    def setup(self, index: int) -> None:
        self.index = 2 * index + (1 if self.split == "test" else 0)
        db, self.request, self.gold_calls = make_task(self.index)
        self.db = db
        self._tools = make_tools(self.db)
        gold = copy.deepcopy(db)
        gold_tools = make_tools(gold)
        for name, args in self.gold_calls:
            gold_tools.call(name, args)
        self.gold_db = gold

    def toolset(self) -> ToolSet:
        assert self._tools is not None
        return self._tools

    def task_text(self) -> str:
        return f"User: {self.request}"

    def task_info(self) -> dict:
        changed = sum(self.db["orders"][o] != self.gold_db["orders"][o] for o in self.db["orders"])
        return {"task_id": f"{self.split}/shop-{self.index}", "task_type": "shop",
                "progress": [f"orders_wrong={changed}"]}

    def score_answer(self, answer: str) -> tuple[float, dict]:
        ok = self.db == self.gold_db
        return float(ok), {"db_matches_gold": ok}

    def oracle_action(self, rng=None, epsilon: float = 0.0) -> str:
        if self.total_calls < len(self.gold_calls):
            name, args = self.gold_calls[self.total_calls]
            # spaces around the tags keep word-level tiny tokenizers from gluing '"}}' to them
            return f'<tool_call> {json.dumps({"name": name, "arguments": args})} </tool_call>'
        return "<answer> done </answer>"

    def snapshot(self):
        return (copy.deepcopy(self.db), self.turns, self.done, self.total_calls,
                self.total_invalid)

    def restore(self, snap) -> None:
        db, self.turns, self.done, self.total_calls, self.total_invalid = snap
        self.db.clear()
        self.db.update(copy.deepcopy(db))  # the tools hold a reference to self.db
