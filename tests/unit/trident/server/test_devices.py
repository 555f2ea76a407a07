from trident.server.devices import gpu_count, visible


def test_visible_devices_rules():
    assert visible(4, None) == 4
    assert visible(4, "") == 0
    assert visible(4, "0,1") == 2
    assert visible(4, "1,-1,2") == 1
    assert visible(2, "0,1,2,3") == 2


def test_gpu_count_on_this_host_is_an_int():
    n = gpu_count()
    assert isinstance(n, int) and n >= 0
