"""EtcdStore beyond single keys: lists of any size, leader election, writes fenced by a leader's key, leases
kept alive over one stream."""

from __future__ import annotations

import asyncio

import pytest


async def test_a_list_of_more_keys_than_one_reply_may_carry_returns_every_key_at_one_revision(etcd_store):
    from services.common import etcd

    value = b"x" * 40_000  # 300 of them are 12 MB: three times gRPC's default reply limit
    for i in range(0, 300, 25):  # (etcd takes requests up to 1.5 MB)
        assert (await etcd_store.create({f"big/{j:04d}": value for j in range(i, i + 25)})).succeeded
    kvs, revision = await etcd_store.list("big/")
    assert [kv.key for kv in kvs] == [f"big/{j:04d}" for j in range(300)]
    assert len(kvs) > etcd.LIST_PAGE and all(kv.value == value for kv in kvs)
    assert revision == await etcd_store.revision()


async def test_a_fenced_store_writes_only_while_its_leader_holds_the_key(etcd_store):
    from services.common.etcd import Election, Fenced

    first = Election(etcd_store, "lead", "a", ttl_seconds=2, poll_seconds=0.1)
    revision = await first.campaign()
    mine = etcd_store.fenced("lead", revision)
    await mine.put("x", b"1")
    assert (await mine.cas("x", b"2", (await etcd_store.get("x")).mod_revision)).succeeded
    second = Election(etcd_store, "lead", "b", ttl_seconds=2, poll_seconds=0.1)
    takeover = asyncio.ensure_future(second.campaign())
    await asyncio.sleep(0.3)
    assert not takeover.done() and await second.leader() == "a"  # one leader at a time
    await first.resign()
    theirs = etcd_store.fenced("lead", await asyncio.wait_for(takeover, 2))
    assert await second.leader() == "b"
    for write in (lambda: mine.put("x", b"3"), lambda: mine.create({"y": b"1"}), lambda: mine.cas("x", b"3", 0),
                  lambda: mine.delete("x")):
        with pytest.raises(Fenced):
            await write()
    assert (await etcd_store.get("x")).value == b"2" and await etcd_store.get("y") is None
    await theirs.put("x", b"4")
    assert (await etcd_store.get("x")).value == b"4"
    await second.resign()


async def test_a_leader_whose_lease_lapses_knows_it_and_a_standby_takes_over(etcd_store):
    from services.common.etcd import Election

    first = Election(etcd_store, "lead", "a", ttl_seconds=1, poll_seconds=0.1)
    await first.campaign()
    first._keeper.cancel()  # as if paused: no keep-alive
    second = Election(etcd_store, "lead", "b", ttl_seconds=1, poll_seconds=0.1)
    began = asyncio.get_running_loop().time()
    await asyncio.wait_for(second.campaign(), 5)
    assert asyncio.get_running_loop().time() - began < 1 + 2 and await second.leader() == "b"
    await second.resign()


async def test_leases_are_kept_alive_over_one_stream_and_a_lost_lease_answers_zero(etcd_store):
    leases = [await etcd_store.grant_lease(2) for _ in range(20)]
    for _ in range(3):  # past the TTL: every refresh answered, each for its own lease
        ttls = await asyncio.gather(*(etcd_store.refresh_lease(lease) for lease in leases * 2))
        assert all(ttl > 0 for ttl in ttls), ttls
        await asyncio.sleep(1.0)
    assert await etcd_store.revoke_lease(leases[0])
    assert await etcd_store.refresh_lease(leases[0]) == 0 and await etcd_store.refresh_lease(leases[1]) > 0
    stream = etcd_store._keepalives._reader
    assert stream is not None and not stream.done()  # one stream served them all
    assert etcd_store._keepalives._waiters == {}
