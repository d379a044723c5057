<#
.SYNOPSIS
    Registers expertd.exe with the Windows Service Control Manager, or removes it.

.DESCRIPTION
    Creates the service "expertd" (start type Automatic) running
        "<BinaryPath>" --config "<ConfigPath>"
    under the virtual account NT SERVICE\expertd (least privilege; no password to manage),
    sets its description, and sets recovery actions: restart 5 s after the first and second
    failure and 60 s after later ones, counters reset after a day. Failure flag 1 makes the
    actions apply also when the daemon exits with a non-zero code, not only when it crashes.

    UNTESTED: the Windows build of expertd is not produced by this repository yet (see
    README.md next to this script). Run from an elevated PowerShell (5.1 or 7).

.PARAMETER Uninstall
    Stops and deletes the service. Config, models and logs are left in place.

.EXAMPLE
    .\install-service.ps1 -BinaryPath 'C:\Program Files\expertd\expertd.exe'
.EXAMPLE
    .\install-service.ps1 -Uninstall
#>
[CmdletBinding()]
param(
    [string]$BinaryPath = (Join-Path $env:ProgramFiles 'expertd\expertd.exe'),
    [string]$ConfigPath = (Join-Path $env:ProgramData 'expertd\expertd.toml'),
    [string]$ServiceName = 'expertd',
    # 'NT SERVICE\<name>' (virtual account), 'NT AUTHORITY\LocalService' or 'LocalSystem'.
    [string]$Account = '',
    # Replace an existing service of the same name instead of stopping with an error.
    [switch]$Force,
    [switch]$Uninstall
)

Set-StrictMode -Version Latest
$ErrorActionPreference = 'Stop'

function Assert-Administrator {
    $identity = [Security.Principal.WindowsIdentity]::GetCurrent()
    $principal = New-Object Security.Principal.WindowsPrincipal($identity)
    if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) {
        throw 'Run this script from an elevated PowerShell (Run as administrator).'
    }
}

# sc.exe reports failures only through its exit code; turn them into errors.
function Invoke-Sc {
    param([Parameter(ValueFromRemainingArguments)][string[]]$Arguments)
    $output = & sc.exe @Arguments 2>&1
    if ($LASTEXITCODE -ne 0) {
        throw "sc.exe $($Arguments -join ' ') failed ($LASTEXITCODE): $output"
    }
}

function Remove-ExpertdService {
    param([string]$Name)
    $service = Get-Service -Name $Name -ErrorAction SilentlyContinue
    if ($null -eq $service) {
        Write-Host "Service '$Name' is not installed."
        return
    }
    if ($service.Status -ne 'Stopped') {
        Write-Host "Stopping '$Name' (the daemon drains its leases first) ..."
        Stop-Service -Name $Name -Force
        $service.WaitForStatus('Stopped', [TimeSpan]::FromSeconds(60))
    }
    # Remove-Service exists only in PowerShell 6+; sc.exe works in 5.1 too.
    Invoke-Sc delete $Name
    Write-Host "Service '$Name' removed."
}

Assert-Administrator

if ($Uninstall) {
    Remove-ExpertdService -Name $ServiceName
    return
}

if (-not (Test-Path -LiteralPath $BinaryPath -PathType Leaf)) {
    throw "expertd binary not found: $BinaryPath (pass -BinaryPath)"
}
if (-not (Test-Path -LiteralPath $ConfigPath -PathType Leaf)) {
    throw "config not found: $ConfigPath (copy configs\expertd.toml there, or pass -ConfigPath)"
}
if ($null -ne (Get-Service -Name $ServiceName -ErrorAction SilentlyContinue)) {
    if (-not $Force) {
        throw "Service '$ServiceName' already exists; pass -Force to replace it or -Uninstall."
    }
    Remove-ExpertdService -Name $ServiceName
}

# Quote both paths: the SCM splits an unquoted path with spaces at the first space.
$commandLine = "`"$BinaryPath`" --config `"$ConfigPath`""
New-Service -Name $ServiceName `
    -BinaryPathName $commandLine `
    -DisplayName 'expertd (Mixture-of-Experts weight streaming daemon)' `
    -Description 'Streams Mixture-of-Experts expert weights from disk to GPU memory for local inference engines.' `
    -StartupType Automatic | Out-Null

if ($Account -eq '') { $Account = "NT SERVICE\$ServiceName" }
# Virtual and built-in service accounts take no password.
Invoke-Sc config $ServiceName obj= $Account

# Recovery: restart after 5 s, 5 s, then 60 s; reset the failure count after 86400 s.
Invoke-Sc failure $ServiceName reset= 86400 actions= restart/5000/restart/5000/restart/60000
Invoke-Sc failureflag $ServiceName 1

Write-Host "Service '$ServiceName' installed: $commandLine (account $Account)."
Write-Host "Give $Account read access to the config and model files, e.g.:"
Write-Host "  icacls `"$(Split-Path -Parent $ConfigPath)`" /grant `"${Account}:(OI)(CI)RX`""
Write-Host "Start it with: Start-Service $ServiceName"
