#!/usr/bin/python3
"""Drives python-dbusmock's bluez5 template for tests/ble.rs: one long-lived process that
reads commands from stdin, one per line, and answers each with one line, "ok [value]" or
"err message". DBUS_SYSTEM_BUS_ADDRESS points at the test's private bus.

Devices are added with Mock.AddObject and the correct D-Bus types (the template's AddDevice
sends ManufacturerData as aa{qv}, which bluez-async ignores) and an InterfacesAdded signal;
properties change through org.freedesktop.DBus.Properties.Set, which emits PropertiesChanged
(Mock.UpdateProperties crashes on dict values in dbusmock 0.28).

Commands (MAC as AA:BB:CC:DD:EE:FF, CID decimal, HEX the bytes after the company id):
  wait-bluez SECS                      until org.bluez has an owner
  adapter HCI                          Mock.AddAdapter
  remove-adapter HCI                   Mock.RemoveAdapter (an adapter unplugged: its devices stay)
  wait-discovering HCI 0|1 SECS        until the adapter's Discovering is that
  add HCI MAC NAME RSSI CID HEX        a device with manufacturer data
  add-svc HCI MAC RSSI UUID HEX        a device with service data only
  mfg HCI MAC CID HEX                  new manufacturer data
  rssi HCI MAC RSSI                    new RSSI
  advert HCI MAC RSSI CID HEX          one advert as BlueZ signals it: RSSI and manufacturer
                                       data in one PropertiesChanged
  forget HCI MAC                       BlueZ forgets the device (as 30 s after it was last
                                       seen): the object goes, with InterfacesRemoved
  filter HCI                           the last discovery filter set, as KEY=VALUE ... (sorted)
  power HCI 0|1                        Powered (off also stops discovery, as BlueZ does;
                                       one PropertiesChanged)
  stop-discovery HCI                   Discovering = false, as when BlueZ stops a scan
  devices HCI                          how many device objects the adapter has
  rotate HCI COUNT FIRST CID HEX       COUNT devices with MACs C0:00:xx.. from index FIRST
  tapes HCI COUNT CID                  COUNT tapes C0:FF:EE:00:00:00.. with counter 0
  rate HCI TAPES RATE SECS CID         SECS of RATE mfg updates/s round-robin over the TAPES
                                       tapes (counters 1, 2, ..); each update is sent without
                                       waiting for its reply; answers "count seconds"
"""
import sys
import time

import dbus
import dbus.lowlevel

MOCK = 'org.freedesktop.DBus.Mock'
DEV = 'org.bluez.Device1'
ADAPTER = 'org.bluez.Adapter1'
PROPS = 'org.freedesktop.DBus.Properties'

bus = dbus.SystemBus()


def dev_path(hci, addr):
    return f'/org/bluez/{hci}/dev_' + addr.replace(':', '_').upper()


def mfg(cid, hexs):
    return dbus.Dictionary({dbus.UInt16(int(cid)): dbus.Array(bytes.fromhex(hexs), signature='y')},
                           signature='qv')


def svc(uuid, hexs):
    return dbus.Dictionary({uuid: dbus.Array(bytes.fromhex(hexs), signature='y')}, signature='sv')


def root():
    return bus.get_object('org.bluez', '/')


def add(hci, addr, name, rssi, manufacturer, service, uuids, wait=True):
    path = dev_path(hci, addr)
    props = dbus.Dictionary({
        'Address': dbus.String(addr), 'AddressType': dbus.String('random'),
        'Adapter': dbus.ObjectPath(f'/org/bluez/{hci}'),
        'Paired': dbus.Boolean(False), 'Bonded': dbus.Boolean(False),
        'Connected': dbus.Boolean(False), 'Trusted': dbus.Boolean(False),
        'Blocked': dbus.Boolean(False), 'LegacyPairing': dbus.Boolean(False),
        'ServicesResolved': dbus.Boolean(False),
        'UUIDs': dbus.Array(uuids, signature='s'),
        'RSSI': dbus.Int16(int(rssi)),
        'ManufacturerData': manufacturer,
        'ServiceData': service,
    }, signature='sv')
    if name != '-':
        props['Name'] = dbus.String(name)
        props['Alias'] = dbus.String(name)
    added = [dbus.ObjectPath(path), dbus.Dictionary({DEV: props}, signature='sa{sv}')]
    if wait:
        r = root()
        r.AddObject(path, DEV, props, [], dbus_interface=MOCK)
        r.EmitSignal('org.freedesktop.DBus.ObjectManager', 'InterfacesAdded', 'oa{sa{sv}}',
                     added, dbus_interface=MOCK)
        return
    # Without waiting for the replies: the mock handles the calls in order.
    add_object = dbus.lowlevel.MethodCallMessage('org.bluez', '/', MOCK, 'AddObject')
    add_object.append(path, DEV, props, dbus.Array([], signature='(ssss)'), signature='ssa{sv}a(ssss)')
    emit = dbus.lowlevel.MethodCallMessage('org.bluez', '/', MOCK, 'EmitSignal')
    emit.append('org.freedesktop.DBus.ObjectManager', 'InterfacesAdded', 'oa{sa{sv}}', added,
                signature='sssav')
    for m in (add_object, emit):
        m.set_no_reply(True)
        bus.send_message(m)


def set_dev(hci, addr, key, value):
    bus.get_object('org.bluez', dev_path(hci, addr)).Set(DEV, key, value, dbus_interface=PROPS)


def adapter_obj(hci):
    return bus.get_object('org.bluez', f'/org/bluez/{hci}')


def wait(secs, cond):
    deadline = time.monotonic() + float(secs)
    while True:
        try:
            if cond():
                return True
        except dbus.exceptions.DBusException:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def rotating_mac(i):
    return 'C0:00:%02X:%02X:%02X:%02X' % ((i >> 24) & 0xFF, (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF)


def tape_mac(i):
    return 'C0:FF:EE:%02X:%02X:%02X' % ((i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF)


def tape_payload(counter):
    return '4956' + '%02x%02x' % (counter & 0xFF, (counter >> 8) & 0xFF) + '10015a00010203'


def command(words):
    cmd, a = words[0], words[1:]
    if cmd == 'wait-bluez':
        drv = bus.get_object('org.freedesktop.DBus', '/org/freedesktop/DBus')
        ok = wait(a[0], lambda: drv.NameHasOwner('org.bluez', dbus_interface='org.freedesktop.DBus'))
        return 'ok' if ok else 'err org.bluez has no owner'
    if cmd == 'adapter':
        root().AddAdapter(a[0], 'test-gw', dbus_interface='org.bluez.Mock')
        return 'ok'
    if cmd == 'remove-adapter':
        root().RemoveAdapter(a[0], dbus_interface='org.bluez.Mock')
        return 'ok'
    if cmd == 'wait-discovering':
        want = a[1] == '1'
        ok = wait(a[2], lambda: bool(adapter_obj(a[0]).Get(ADAPTER, 'Discovering', dbus_interface=PROPS)) == want)
        return 'ok' if ok else 'err Discovering did not become %s' % a[1]
    if cmd == 'add':
        hci, addr, name, rssi, cid, data = a
        add(hci, addr, name, rssi, mfg(cid, data), dbus.Dictionary({}, signature='sv'), [])
        return 'ok'
    if cmd == 'add-svc':
        hci, addr, rssi, uuid, data = a
        add(hci, addr, '-', rssi, dbus.Dictionary({}, signature='qv'), svc(uuid, data), [uuid])
        return 'ok'
    if cmd == 'mfg':
        set_dev(a[0], a[1], 'ManufacturerData', mfg(a[2], a[3]))
        return 'ok'
    if cmd == 'rssi':
        set_dev(a[0], a[1], 'RSSI', dbus.Int16(int(a[2])))
        return 'ok'
    if cmd == 'advert':
        hci, addr, rssi, cid, data = a
        dev = bus.get_object('org.bluez', dev_path(hci, addr))
        changed = dbus.Dictionary({'RSSI': dbus.Int16(int(rssi)), 'ManufacturerData': mfg(cid, data)},
                                  signature='sv')
        dev.EmitSignal(PROPS, 'PropertiesChanged', 'sa{sv}as',
                       [DEV, changed, dbus.Array([], signature='s')], dbus_interface=MOCK)
        return 'ok'
    if cmd == 'forget':
        adapter_obj(a[0]).RemoveDevice(dbus.ObjectPath(dev_path(a[0], a[1])), dbus_interface=ADAPTER)
        return 'ok'
    if cmd == 'filter':
        calls = adapter_obj(a[0]).GetMethodCalls('SetDiscoveryFilter', dbus_interface=MOCK)
        if not calls:
            return 'ok'
        f = calls[-1][1][0]
        return 'ok ' + ' '.join('%s=%s' % (k, ('true' if v else 'false') if isinstance(v, dbus.Boolean) else v)
                                for k, v in sorted(f.items()))
    if cmd == 'power':
        props = {'Powered': dbus.Boolean(a[1] == '1')}
        if a[1] != '1':
            props['Discovering'] = dbus.Boolean(False)
        adapter_obj(a[0]).UpdateProperties(ADAPTER, props, dbus_interface=MOCK)
        return 'ok'
    if cmd == 'stop-discovery':
        adapter_obj(a[0]).Set(ADAPTER, 'Discovering', dbus.Boolean(False), dbus_interface=PROPS)
        return 'ok'
    if cmd == 'devices':
        objs = root().GetManagedObjects(dbus_interface='org.freedesktop.DBus.ObjectManager')
        prefix = f'/org/bluez/{a[0]}/dev_'
        return 'ok %d' % sum(1 for p, ifaces in objs.items() if p.startswith(prefix) and DEV in ifaces)
    if cmd == 'rotate':
        hci, count, first, cid, data = a[0], int(a[1]), int(a[2]), a[3], a[4]
        for i in range(first, first + count):
            add(hci, rotating_mac(i), '-', -70, mfg(cid, data), dbus.Dictionary({}, signature='sv'), [],
                wait=False)
        bus.flush()
        return 'ok'
    if cmd == 'tapes':
        hci, count, cid = a[0], int(a[1]), a[2]
        for i in range(count):
            add(hci, tape_mac(i), 'TT', -60, mfg(cid, tape_payload(0)), dbus.Dictionary({}, signature='sv'), [])
        return 'ok'
    if cmd == 'rate':
        hci, tapes, rate, secs, cid = a[0], int(a[1]), float(a[2]), float(a[3]), a[4]
        paths = [dev_path(hci, tape_mac(i)) for i in range(tapes)]
        total = int(rate * secs)
        start = time.monotonic()
        for n in range(total):
            due = start + n / rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            counter = 1 + n // tapes
            msg = dbus.lowlevel.MethodCallMessage('org.bluez', paths[n % tapes], PROPS, 'Set')
            msg.append(DEV, 'ManufacturerData', mfg(cid, tape_payload(counter)), signature='ssv')
            msg.set_no_reply(True)
            bus.send_message(msg)
        bus.flush()
        return 'ok %d %.3f' % (total, time.monotonic() - start)
    return 'err unknown command ' + cmd


def main():
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            answer = command(words)
        except Exception as e:  # answer the test instead of dying
            answer = 'err %s' % str(e).replace('\n', ' ')
        sys.stdout.write(answer + '\n')
        sys.stdout.flush()


if __name__ == '__main__':
    main()
